"""An Accelerate/Lightning-style script: init_process_group() with no backend, then new_subgroups.

    enable_accelerate.py GROUP_SIZE
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _script_io import done, hold, out, tensor_text

dist.init_process_group()
rank = dist.get_rank()
out("get_backend", dist.get_backend())
out("pg_backend_name", dist.distributed_c10d._get_default_group()._get_backend_name())
mine, groups = dist.new_subgroups(group_size=int(sys.argv[1]))
out("subgroups", len(groups))
out("sub_backend", dist.get_backend(mine))
out("sub_pg_backend_name", mine._get_backend_name())
t = torch.arange(3, dtype=torch.float32) * (rank + 1)
dist.all_reduce(t, group=mine)
out("sub_all_reduce", tensor_text(t))
objs = [None] * dist.get_world_size()
dist.all_gather_object(objs, {"rank": rank})
out("all_gather_object", objs)

hold()
dist.destroy_process_group()
done()
