"""A DDP loop in which one rank skips a step's gradient all_reduce (its backward runs under no_sync()).

    ddp_skip_step.py SKIPPER STEPS

Unmodified training code: run it with FRNCCL_ENABLE=1 (gloo, CPU). Every rank trains STEPS steps; rank
SKIPPER's step 2 runs under ddp.no_sync(), so it issues one bucket all_reduce fewer, ends its loop one op
short of the others, and leaves cleanly (exit 0). The others then fail in the last all_reduce, whose
partner left.
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> int:
    skipper, steps = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(steps):
        x = torch.randn(8, 32)
        if rank == skipper and step == 2:
            with ddp.no_sync():
                ddp(x).sum().backward()
        else:
            ddp(x).sum().backward()
        opt.step()
        opt.zero_grad()
        print(f"rank {rank} step {step}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
