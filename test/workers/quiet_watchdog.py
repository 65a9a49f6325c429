"""Finished ops must never look hung: run every op once on a group with a short
timeout, wait past that timeout, and check the recorder shows all of them
completed (and, on the pytest side, that no timeout incident was reported).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

import fr_backend
from _ops import cases
from _worker import RANK, WORLD, Checks, finish, init

TIMEOUT_S = 2.0

init("frnccl", timeout_s=TIMEOUT_S)
checks = Checks()
G = dist.group.WORLD
ran = []
for a in (False, True):
    for name, fn in cases(f"q/{a}", 10, torch.float32, a, WORLD):
        if "BAND" in name:
            continue  # gloo refuses it: an error, not a finished op
        fn(G)
        ran.append(name)
dist.barrier()
if RANK in (0, 1):
    buf = torch.zeros(3)
    if RANK == 0:
        dist.send(torch.ones(3), dst=1)
    else:
        dist.recv(buf, src=0)
time.sleep(TIMEOUT_S * 2 + 0.5)
es = fr_backend.trace_entries(symbolize=False)["entries"]
stuck = sorted({(e["profiling_name"], e["state"]) for e in es if e["state"] != "completed"})
checks.expect("ops_recorded", len(es) >= len(ran), f"{len(es)} entries for {len(ran)} ops")
checks.expect("all_completed_after_timeout", not stuck, f"never completed: {stuck}")
t = torch.ones(1)
dist.all_reduce(t)
checks.expect("group_still_usable", t.item() == WORLD, str(t))
finish(checks)
