"""A Megatron-style script: init_process_group(backend=..., world_size=, rank=, timeout=), then tensor- and
data-parallel groups made with new_group over every rank list (each rank creates all of them).

    enable_megatron.py TP
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from _script_io import done, hold, out, tensor_text

tp = int(sys.argv[1])
world = int(os.environ["WORLD_SIZE"])
dist.init_process_group(backend="gloo", world_size=world, rank=int(os.environ["RANK"]), timeout=timedelta(minutes=10))
rank = dist.get_rank()
out("get_backend", dist.get_backend())
tp_group = dp_group = None
for start in range(0, world, tp):
    ranks = list(range(start, start + tp))
    group = dist.new_group(ranks)
    if rank in ranks:
        tp_group = group
for first in range(tp):
    ranks = list(range(first, world, tp))
    group = dist.new_group(ranks)
    if rank in ranks:
        dp_group = group
for name, group in (("tp", tp_group), ("dp", dp_group)):
    out(f"{name}_backend", dist.get_backend(group))
    out(f"{name}_pg_backend_name", group._get_backend_name())
    t = torch.ones(3) * (rank + 1)
    dist.all_reduce(t, group=group)
    out(f"{name}_all_reduce", tensor_text(t))
    dist.barrier(group=group)

hold()
dist.destroy_process_group()
done()
