"""A small 2-rank job for the compact dump: collectives of several kinds and dtypes, p2p, ops on a
subgroup, one op that is still running, then one job-wide dump (SIGUSR1 on rank 0) in the formats
FRNCCL_DUMP_FORMATS names. Reports the incident folder and the entry count."""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from _worker import RANK, WORLD, init

DUMP_DIR = os.environ["FRNCCL_DUMP_DIR"]

init("frnccl")
GLOO = dist.new_group(backend="gloo")
SUB = dist.new_group([0, 1])

n = 0
for i in range(40):
    t = torch.ones(4, 3) * (RANK + i)
    dist.all_reduce(t)
    out = torch.zeros(2 * WORLD, dtype=torch.int64)
    dist.all_gather_into_tensor(out, torch.full((2,), RANK, dtype=torch.int64))
    dist.broadcast(torch.arange(5, dtype=torch.float16), src=0, group=SUB)
    if RANK == 0:
        dist.send(torch.ones(3), dst=1)
    else:
        dist.recv(torch.zeros(3), src=0)
    n += 4
# Rank 1 waits on a recv that rank 0 sends only after the dump: an unfinished op in rank 1's dump.
pending = dist.irecv(torch.zeros(6), src=0) if RANK == 1 else None
n += 1 if RANK == 1 else 0
dist.barrier(group=GLOO)
if RANK == 0:
    os.kill(os.getpid(), signal.SIGUSR1)
# Every format this rank writes, in place (each is linked in once complete).
FORMATS = [f.strip() for f in (os.environ.get("FRNCCL_DUMP_FORMATS") or "compact").split(",") if f.strip()]
PATTERNS = {"compact": f"compact/frnccl_rank_{RANK}.json*", "pickle": f"pickle/frnccl_rank_{RANK}",
            "json": f"json/frnccl_rank_{RANK}.json", "chrome": f"chrome/frnccl_rank_{RANK}.trace.json"}
deadline = time.monotonic() + 60
incident = None
while time.monotonic() < deadline:
    found = [glob.glob(os.path.join(DUMP_DIR, "*-signal-*", PATTERNS[f])) for f in FORMATS]
    if all(found):
        incident = os.path.dirname(os.path.dirname(found[0][0]))
        break
    time.sleep(0.05)
dist.barrier(group=GLOO)
if RANK == 0:
    dist.send(torch.ones(6), dst=1)
else:
    pending.wait()
print("RESULT " + json.dumps({"rank": RANK, "incident": incident,
                              "entries": n}), flush=True)
dist.barrier(group=GLOO)
dist.destroy_process_group()
sys.stdout.flush()
