"""_abort_process_group while a job-wide dump waits for a rank that will never write its part.

Rank 1 leaves right after the first op. Rank 0 asks for a job-wide dump (the dump signal), whose trigger
then waits up to FRNCCL_DUMP_TIMEOUT_SEC for rank 1, and aborts meanwhile: abort must not wait for it.
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _abort_process_group

from _worker import RANK, Checks, init

init("frnccl")
t = torch.ones(4)
dist.all_reduce(t)
checks = Checks()
if RANK == 1:
    checks.report()
    os._exit(0)
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(0.5)  # the monitor takes the request, writes rank 0's part and waits for rank 1
start = time.monotonic()
_abort_process_group()
took = time.monotonic() - start
checks.notes["abort_s"] = round(took, 3)
checks.expect("abort_fast", took < 2.0, f"_abort_process_group took {took:.1f} s")
checks.report()
