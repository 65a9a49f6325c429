"""How much of a job torch's own flight recorder holds: the hooks it attached and the entries it recorded.

Usage (env://): torch_recorder.py BACKEND OPS
Runs OPS all_reduces on the default group (BACKEND) and on a subgroup of ranks 0 and 1, then
prints `RESULT {...}` with, for the groups of this job:
  hooks: how many carry a hook of torch's hook-based recorder (torch 2.15), None where torch has none;
  entries: how many entries torch's recorder holds for them, None where torch cannot dump its
  CPU-side recorder from Python;
  inner: what each group's backend object is, by torch's name.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

backend, ops = sys.argv[1], int(sys.argv[2])
dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=60))
rank = dist.get_rank()
sub = dist.new_group([0, 1], backend=backend)
groups = [dist.group.WORLD] + ([sub] if rank in (0, 1) else [])
for _ in range(ops):
    for group in groups:
        t = torch.ones(4)
        dist.all_reduce(t, group=group)
names = {distributed_c10d._get_process_group_name(g) for g in groups}

hooks = getattr(distributed_c10d._world, "pg_flight_recorder_hooks", None)
hooked = None if hooks is None else sum(1 for g in groups if g in hooks)


def torch_entries() -> int | None:
    dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace", None)
    if dump is None:
        return None
    try:
        raw = dump(True, False, False, backend="gloo")
    except TypeError:  # a torch whose dump takes no backend
        raw = dump(True, False, False)
    trace = pickle.loads(raw)
    return sum(1 for e in trace.get("entries", []) if str(e.get("process_group", ("",))[0]) in names)


print("RESULT " + json.dumps({
    "rank": rank,
    "hooks": hooked,
    "entries": torch_entries(),
    "recorder_api": hasattr(distributed_c10d, "_FR_SELF_RECORDING_BACKENDS"),
    "torch": torch.__version__,
}), flush=True)
dist.destroy_process_group()
# torch's Gloo worker threads can abort a plain gloo job at interpreter exit ("terminate called without an
# active exception"); what is measured here is printed already.
os._exit(0)
