"""A torchtitan-style script: it configures torch's flight recorder as torchtitan's comm.trace_buf_size and
comm.save_traces_folder do, then init_device_mesh("cpu", (2, 2)) (which creates the default group itself)
and collectives over the mesh's dimensions.

    enable_titan.py TRACE_FOLDER
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from _script_io import done, hold, out, tensor_text
from torch.distributed.device_mesh import init_device_mesh

os.environ["TORCH_FR_BUFFER_SIZE"] = "5000"  # comm.trace_buf_size
os.environ["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(sys.argv[1], "rank_")  # comm.save_traces_folder

mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
rank = dist.get_rank()
out("get_backend", dist.get_backend())
out("pg_backend_name", dist.distributed_c10d._get_default_group()._get_backend_name())
for dim in ("dp", "tp"):
    group = mesh[dim].get_group()
    out(f"{dim}_backend", dist.get_backend(group))
    out(f"{dim}_pg_backend_name", group._get_backend_name())
    out(f"{dim}_ranks", dist.get_process_group_ranks(group))
    t = torch.arange(4, dtype=torch.float32) + 10 * rank
    dist.all_reduce(t, group=group)
    out(f"{dim}_all_reduce", tensor_text(t))
gathered = [torch.zeros(2) for _ in range(mesh["tp"].size())]
dist.all_gather(gathered, torch.full((2,), float(rank)), group=mesh["tp"].get_group())
out("tp_all_gather", ";".join(tensor_text(g) for g in gathered))

hold()
dist.destroy_process_group()
done()
