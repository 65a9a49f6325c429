"""A job that tears its groups down and starts again on the same store address, as a restart loop in one
process does: rank 0 sets a key in the first life's store, both ranks destroy, wait past the detector's
life check, and init again. Plain torch then has a fresh store (the first one's server went with the last
reference to it): each rank prints `KEY_AFTER_REINIT <present>`."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def main() -> int:
    dist.init_process_group("frnccl")
    rank = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 0:
        dist.distributed_c10d._get_default_store().set("life1/probe", "1")
    dist.barrier()
    dist.destroy_process_group()
    time.sleep(2.0)  # past the detector's life check (0.5 s), well within its first window
    dist.init_process_group("frnccl")
    present = dist.distributed_c10d._get_default_store().check(["life1/probe"])
    dist.all_reduce(t)
    print(f"KEY_AFTER_REINIT {present}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
