"""Early exit to a closing collective on a 2x2 mesh: ranks that run out of data leave the training loop and enter
the job's closing world op while their peers go on to the next step.

    verdict_early_exit.py STEPS CLOSING LEAVER:STEPS [LEAVER:STEPS ...]

Every rank runs a 2x2 DeviceMesh (dims "tp" and "dp": tp groups [0,1],[2,3], dp groups [0,2],[1,3]) and, each
step, a tp all_reduce then a dp all_reduce, for STEPS steps; then the closing world op CLOSING (barrier or
all_reduce). Each LEAVER runs only its own STEPS steps (fewer) before it enters the closing op: its tp and dp
peers wait for it in their next step's all_reduces, it waits in the world op that nobody else reaches.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def main() -> int:
    steps, closing = int(sys.argv[1]), sys.argv[2]
    leavers = {int(r): int(n) for r, n in (a.split(":") for a in sys.argv[3:])}
    timeout = timedelta(seconds=float(os.environ.get("INCIDENT_PG_TIMEOUT", "4")))
    dist.init_process_group(backend="frnccl", timeout=timeout)
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    t = torch.ones(64)
    for _ in range(leavers.get(rank, steps)):
        dist.all_reduce(t, group=tp)
        dist.all_reduce(t, group=dp)
    if rank in leavers:
        print(f"rank {rank} ran out of data and enters the closing {closing}", flush=True)
    if closing == "barrier":
        dist.barrier()
    else:
        dist.all_reduce(t)
    print(f"rank {rank} UNEXPECTEDLY passed the closing {closing}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
