"""The job `frnccl demo` launches with torchrun: a small training-like loop on
two process groups, in which one rank gets stuck (or misbehaves) at one step.

Groups: the default group plays data parallel; pairs of ranks form
"tensor-parallel" subgroups. Nothing here imports fr_backend: the backend is
found through its `torch.backends` entry point, as in an unmodified script.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def load_next_batch(step: int, stuck: bool) -> torch.Tensor:
    """Stands in for a data loader; the culprit rank hangs here."""
    if stuck:
        time.sleep(3600)
    return torch.full((256,), float(step))


def main() -> int:
    fault = os.environ.get("FRNCCL_DEMO_FAULT", "skip")
    steps = int(os.environ.get("FRNCCL_DEMO_STEPS", "6"))
    fault_step = int(os.environ.get("FRNCCL_DEMO_FAULT_STEP", "3"))
    timeout_s = float(os.environ.get("FRNCCL_DEMO_TIMEOUT_SEC", "5"))
    dist.init_process_group(backend="frnccl", timeout=timedelta(seconds=timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    culprit = world - 1
    tp_groups = [dist.new_group([r, r + 1], group_desc=f"tp{r // 2}") for r in range(0, world - 1, 2)]
    tp = tp_groups[min(rank // 2, len(tp_groups) - 1)]
    weights = torch.ones(1024)
    for step in range(1, steps + 1):
        misbehave = fault != "none" and rank == culprit and step == fault_step
        batch = load_next_batch(step, stuck=misbehave and fault == "skip")
        activations = batch.repeat(4)
        if rank < 2 * len(tp_groups):
            dist.all_reduce(activations, group=tp)  # tensor-parallel exchange
        grads = weights * float(step)
        if misbehave and fault == "mismatch":
            grads = torch.ones(512)  # wrong gradient size: a classic desync
        dist.all_reduce(grads)  # data-parallel gradient sync
        if rank == 0:
            print(f"[demo] step {step}/{steps} done", flush=True)
        time.sleep(0.2)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
