"""A small healthy job (2 ranks): a few collectives and p2p, then dumps.

1. a job-wide dump (SIGUSR1 on rank 0): every rank writes into one incident
   folder (the default format, compact), which torch's fr_trace must read as a
   healthy job once `frnccl export --torch` made pickles of it;
2. more ops, then fr_backend.dump() twice in a row on each rank: each call is a
   new incident and must get its own folder (the first is never overwritten).

Reports the folders fr_backend.dump() returned and the entry count at each dump.
Run with FRNCCL_STACKS=none by the test, so frames must be empty everywhere.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import fr_backend
from _worker import RANK, WORLD, init

DUMP_DIR = os.environ["FRNCCL_DUMP_DIR"]

init("frnccl")
GLOO = dist.new_group(backend="gloo")


def healthy_ops(rounds: int) -> int:
    """Issues 4 ops per round on every rank; returns how many."""
    for i in range(rounds):
        t = torch.ones(16) * (RANK + i)
        dist.all_reduce(t)
        out = torch.zeros(4 * WORLD)
        dist.all_gather_into_tensor(out, torch.full((4,), float(RANK)))
        b = torch.arange(8, dtype=torch.int64)
        dist.broadcast(b, src=0)
        p = torch.zeros(3)
        if RANK == 0:
            dist.send(torch.ones(3), dst=1)
        elif RANK == 1:
            dist.recv(p, src=0)
    return 4 * rounds


def wait_for_file(pattern: str, timeout_s: float = 30) -> str | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = glob.glob(pattern)
        if found:
            return found[0]
        time.sleep(0.05)
    return None


n = healthy_ops(3)
# No pause for the watchdog: a dump asks it for a pass of its own, so every op
# that returned before the dump shows as completed.
dist.barrier(group=GLOO)
if RANK == 0:
    os.kill(os.getpid(), signal.SIGUSR1)
# The default format: compact only.
signal_file = wait_for_file(os.path.join(DUMP_DIR, "*-signal-*", "compact", f"frnccl_rank_{RANK}.json.gz"))
dist.barrier(group=GLOO)
first_count = n

n += healthy_ops(1)
dist.barrier(group=GLOO)
# Both dumps within one wall-clock second (start just after a second boundary), so
# whether they share a folder does not depend on where in the second they fall.
time.sleep(1.05 - time.time() % 1.0)
first = fr_backend.dump()
first_file = os.path.join(first, "compact", f"frnccl_rank_{RANK}.json.gz")
first_entries_then = len(fr_backend.load_dump(first_file)["entries"])
n += healthy_ops(1)  # the second dump holds more entries than the first
second = fr_backend.dump()
second_states = [e["state"] for e in
                 fr_backend.load_dump(os.path.join(second, "compact", f"frnccl_rank_{RANK}.json.gz"))["entries"]]
dumps_within_one_second = time.time() % 1.0 > 0.05
first_entries_after = len(fr_backend.load_dump(first_file)["entries"])

print("RESULT " + json.dumps({
    "rank": RANK,
    "signal_file": signal_file,
    "signal_entries": first_count,
    "manual_dirs": [first, second],
    "manual_entries": [first_count + 4, n],
    "first_manual_entries_then": first_entries_then,
    "first_manual_entries_after_second": first_entries_after,
    "second_states": second_states,
    "dumps_within_one_second": dumps_within_one_second,
}), flush=True)
dist.barrier(group=GLOO)
dist.destroy_process_group()
sys.stdout.flush()
