"""A plain torchrun-style script: init_process_group with the backend given on the command line
(gloo, none: no backend, or a device:backend spec such as cpu:gloo), an all_reduce, a broadcast, a small DDP model,
split_group where this torch has it. Prints every backend name torch reports.

    enable_torchrun.py {gloo|none|SPEC}
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _script_io import done, hold, out, tensor_text
from torch.distributed import distributed_c10d as c10d

dist.init_process_group(backend=None if sys.argv[1] == "none" else sys.argv[1])
rank, world = dist.get_rank(), dist.get_world_size()
pg = c10d._get_default_group()
out("get_backend", dist.get_backend())
out("get_backend_group", dist.get_backend(pg))
out("pg_backend_name", pg._get_backend_name())
out("pg_backend_config", c10d._world.pg_backend_config[pg])
out("pg_map_backend", c10d._world.pg_map[pg][0])
out("is_nccl", dist.get_backend() == dist.Backend.NCCL)
out("device_types", sorted(str(d) for d in pg._device_types))

x = torch.arange(8, dtype=torch.float32) * (rank + 1)
dist.all_reduce(x)
out("all_reduce", tensor_text(x))
y = torch.full((4,), float(rank))
dist.broadcast(y, src=world - 1)
out("broadcast", tensor_text(y))

torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
model(torch.ones(3, 4) * (rank + 1)).sum().backward()
out("ddp_grad", tensor_text(model.module.weight.grad))
out("ddp_backend_name", model._get_ddp_logging_data().get("backend_name"))

sub = dist.new_group([0, 1])
if rank in (0, 1):
    out("new_group_backend", dist.get_backend(sub))
    out("new_group_pg_backend_name", sub._get_backend_name())
    z = torch.ones(2) * (rank + 1)
    dist.all_reduce(z, group=sub)
    out("new_group_all_reduce", tensor_text(z))

if hasattr(dist, "split_group"):
    try:
        split = dist.split_group(split_ranks=[[0, 1], list(range(2, world))])
        out("split_group", "none" if split is None or split == dist.GroupMember.NON_GROUP_MEMBER
            else f"{dist.get_backend(split)} {split.size()}")
    except Exception as err:  # torch refuses some parents: the refusal is the output to compare
        out("split_group", f"{type(err).__name__}: {err}")

hold()
dist.destroy_process_group()
done()
