"""A CUDA tensor sent to an frnccl group that has no NCCL backend: a clear Python error.

The group is created while torch.cuda.is_available() reports False, so frnccl
builds it with Gloo only; afterwards a CUDA tensor is passed to it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from _worker import WORLD, Checks, finish, init

real_is_available = torch.cuda.is_available
torch.cuda.is_available = lambda: False
try:
    init("frnccl")
finally:
    torch.cuda.is_available = real_is_available
checks = Checks()
try:
    dist.all_reduce(torch.ones(4, device="cuda:0"))
    checks.fail("cuda_tensor_error", "all_reduce of a CUDA tensor succeeded on a group without NCCL")
except Exception as e:  # must be a Python exception naming NCCL, not a crash
    checks.expect("cuda_tensor_error", "NCCL" in str(e), f"{type(e).__name__}: {e}")
t = torch.ones(4)
dist.all_reduce(t)
checks.expect("cpu_still_works", torch.equal(t, torch.full((4,), float(WORLD))), str(t))
finish(checks)
