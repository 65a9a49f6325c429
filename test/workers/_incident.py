"""Shared start of the incident workers: an frnccl default group with the test's
short timeout, warmed up with a few all_reduces."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def warmed_up_group(warmup: int) -> tuple[int, torch.Tensor]:
    timeout_s = float(os.environ.get("INCIDENT_PG_TIMEOUT", "4"))
    dist.init_process_group(backend="frnccl", timeout=timedelta(seconds=timeout_s))
    t = torch.ones(1024)
    for _ in range(warmup):
        dist.all_reduce(t)
    return dist.get_rank(), t
