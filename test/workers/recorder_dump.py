"""A known sequence of ops, then one job-wide dump (SIGUSR1 on rank 0); 3 ranks.

Used by test_recorder.py, which reads the files this job writes. The worker
itself only issues ops, triggers and waits for the dump, and reports what the
test cannot know from outside (pid, clock readings around the ops and the dump).
It also saves fr_backend.trace_entries() (symbolized) for the in-process checks.

Ops (ranks 0-2; SUB = new_group([1, 2]), whose group-local ranks 0, 1 are global 1, 2):
  WORLD: all_reduce, all_gather (list), all_gather_into_tensor, reduce_scatter_tensor,
         all_to_all_single, broadcast; then send 0 -> 1
  SUB:   all_reduce; send 1 -> 2; send 2 -> 1; then rank 2 posts an irecv from 1
         that is only matched after the dump (the one op not finished at dump time)
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import signal
import sys
import time

import torch
import torch.distributed as dist

import fr_backend
import fr_backend._native
from _worker import RANK, WORLD, init

assert WORLD == 3, "recorder_dump.py runs with 3 ranks"
DUMP_DIR = os.environ["FRNCCL_DUMP_DIR"]
OUT_DIR = os.environ["REC_OUT_DIR"]

init("frnccl")
GLOO = dist.new_group(backend="gloo")  # synchronisation only, never recorded
SUB = dist.new_group([1, 2])  # default backend: frnccl
W = dist.group.WORLD


def issue_known_sequence() -> None:
    """Every recorded op of this job comes from here (the test looks for this name in frames)."""
    x = torch.ones(4, 3) * (RANK + 1)
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((4, 3), 6.0)), x
    outs = [torch.zeros(5, dtype=torch.int64) for _ in range(WORLD)]
    dist.all_gather(outs, torch.full((5,), RANK, dtype=torch.int64))
    assert all(torch.equal(o, torch.full((5,), r, dtype=torch.int64)) for r, o in enumerate(outs)), outs
    ag = torch.zeros(2 * WORLD, 2, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(ag, torch.full((2, 2), RANK, dtype=torch.bfloat16))
    rs = torch.zeros(3, dtype=torch.float64)
    dist.reduce_scatter_tensor(rs, torch.arange(3 * WORLD, dtype=torch.float64))
    a2a = torch.zeros(2 * WORLD, dtype=torch.float32)
    dist.all_to_all_single(a2a, torch.arange(2 * WORLD, dtype=torch.float32) + 10 * RANK)
    b = torch.full((7,), RANK, dtype=torch.int32)
    dist.broadcast(b, src=0)
    assert torch.equal(b, torch.zeros(7, dtype=torch.int32)), b
    p = torch.zeros(4)
    if RANK == 0:
        dist.send(torch.ones(4), dst=1)
    elif RANK == 1:
        dist.recv(p, src=0)
    if RANK in (1, 2):
        s = torch.ones(2)
        dist.all_reduce(s, group=SUB)
        assert torch.equal(s, torch.full((2,), 2.0)), s
        q = torch.zeros(3, dtype=torch.float16)
        if RANK == 1:
            dist.send(torch.ones(3, dtype=torch.float16), dst=2, group=SUB)  # global ranks
            dist.recv(q, src=2, group=SUB)
        else:
            dist.recv(q, src=1, group=SUB)
            dist.send(q + 1, dst=1, group=SUB)


t_ops_start = time.time_ns()
issue_known_sequence()
t_ops_end = time.time_ns()

pending = None
late = torch.zeros(5)
if RANK == 2:
    pending = dist.irecv(late, src=1, group=SUB)  # matched only after the dump
time.sleep(0.3)  # the watchdog (10 ms polls while busy) sees the finished ops complete
dist.barrier(group=GLOO)

t_dump_start = time.time_ns()
if RANK == 0:
    os.kill(os.getpid(), signal.SIGUSR1)  # job-wide: every rank writes into one incident folder
mine = None
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    found = glob.glob(os.path.join(DUMP_DIR, "*", "chrome", f"frnccl_rank_{RANK}.trace.json"))
    if found:
        mine = found[0]
        break
    time.sleep(0.05)
t_dump_seen = time.time_ns()
dist.barrier(group=GLOO)
if RANK == 1:
    dist.send(torch.arange(5, dtype=torch.float32), dst=2, group=SUB)
if pending is not None:
    pending.wait()
    assert torch.equal(late, torch.arange(5, dtype=torch.float32)), late

inproc = fr_backend.trace_entries()  # symbolized, in-process
with open(os.path.join(OUT_DIR, f"inproc_{RANK}.pkl"), "wb") as f:
    pickle.dump(inproc, f)

print("RESULT " + json.dumps({
    "rank": RANK,
    "pid": os.getpid(),
    "worker_file": os.path.abspath(__file__),
    "world_group": W.group_name,
    "sub_group": SUB.group_name if RANK in (1, 2) else None,
    "t_ops_start": t_ops_start,
    "t_ops_end": t_ops_end,
    "t_dump_start": t_dump_start,
    "t_dump_seen": t_dump_seen,
    "dump_file_seen": mine,
    # What the header's nccl_version should say: the NCCL torch loaded, on a CUDA build of frnccl.
    "nccl_version_expected": (".".join(str(part) for part in torch.cuda.nccl.version())
                              if fr_backend._native.native().cuda_built() else ""),
}), flush=True)
dist.barrier(group=GLOO)
dist.destroy_process_group()
sys.stdout.flush()
