"""A DDP loop in which one rank skips a step's gradient all_reduce (its backward runs under no_sync()).

    ddp_skip_step.py SKIPPER STEPS [term-at-exit]

Unmodified training code: run it with FRNCCL_ENABLE=1 (gloo, CPU). Every rank trains STEPS steps; rank
SKIPPER's step 2 runs under ddp.no_sync(), so it issues one bucket all_reduce fewer, ends its loop one op
short of the others, and leaves cleanly (exit 0). The others then fail in the last all_reduce, whose
partner left.

With term-at-exit, each other rank gets a SIGTERM (sent to itself) as its exit begins to write its error file:
what torchrun does to the workers still running once the first one failed, at whatever moment that is.
"""

from __future__ import annotations

import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def term_as_the_error_file_is_written() -> None:
    from fr_backend import _exit_note

    write = _exit_note.after_exit

    def stopped_first() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to this thread before kill() returns
        write()

    _exit_note.after_exit = stopped_first


def main() -> int:
    skipper, steps = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    rank = dist.get_rank()
    if sys.argv[3:] == ["term-at-exit"] and rank != skipper:
        term_as_the_error_file_is_written()
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
