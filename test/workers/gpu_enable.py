"""An unmodified NCCL training step under FRNCCL_ENABLE=1 (or without it): no mention of frnccl.

Prints `OUT` lines that must be the same with and without FRNCCL_ENABLE (backend names and results),
then asks for a job-wide dump with the dump signal when told to (`--dump`), and waits for its file.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

local = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local)
dist.init_process_group("nccl", device_id=torch.device("cuda", local))
rank, world = dist.get_rank(), dist.get_world_size()
out = lambda key, value: print(f"OUT {rank} {key}={value}", flush=True)  # noqa: E731
out("get_backend", dist.get_backend())
out("pg_backend_name", dist.group.WORLD._get_backend_name())
x = torch.arange(8, device="cuda", dtype=torch.float32) * (rank + 1)
dist.all_reduce(x)
out("all_reduce", x.tolist())
y = torch.zeros(4, device="cuda") + rank
dist.broadcast(y, src=0)
out("broadcast", y.tolist())
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4).cuda(), device_ids=[local])
model(torch.ones(2, 4, device="cuda")).sum().backward()
out("ddp_backend_name", model._get_ddp_logging_data().get("backend_name"))
torch.cuda.synchronize()
if "--dump" in sys.argv and rank == 0:
    os.kill(os.getpid(), signal.SIGUSR1)
    folder = os.environ["FRNCCL_DUMP_DIR"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
            name.startswith("frnccl_rank_") for _, _, names in os.walk(folder) for name in names):
        time.sleep(0.1)
dist.barrier()
dist.destroy_process_group()
print("DONE", flush=True)
