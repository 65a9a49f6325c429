"""dist.barrier() on a group bound to a device runs where plain nccl's does: on the GPU.

init_process_group(device_id=...) binds the group; its barrier then waits for the caller's queued GPU
work, as plain nccl's does, where a Gloo barrier would let every rank through at once.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from _worker import RANK, Checks, finish

LOCAL = int(os.environ["LOCAL_RANK"])
DEVICE = torch.device("cuda", LOCAL)
torch.cuda.set_device(DEVICE)
# About 0.5 s of GPU time at 2 GHz, longer at lower clocks.
SLEEP_CYCLES = 1_000_000_000
WAITED_S = 0.2

dist.init_process_group("frnccl", init_method="env://", timeout=timedelta(seconds=60), device_id=DEVICE)
FR = dist.group.WORLD
NCCL = dist.new_group(backend="nccl", device_id=DEVICE)
checks = Checks()


def barrier_waits_for_gpu_work(g) -> bool:
    """Rank 0 queues a long kernel and enters the barrier at once; rank 1 is held until that kernel ends."""
    dist.barrier(group=g)
    torch.cuda.synchronize()
    if RANK == 0:
        torch.cuda._sleep(SLEEP_CYCLES)
    start = time.monotonic()
    dist.barrier(group=g)
    waited = time.monotonic() - start
    torch.cuda.synchronize()
    return waited >= WAITED_S


checks.compare("bound_barrier_waits_for_gpu_work", barrier_waits_for_gpu_work, NCCL, FR)
checks.expect("frnccl_barrier_waited", barrier_waits_for_gpu_work(FR), f"a rank was let through in under {WAITED_S} s")
finish(checks)
