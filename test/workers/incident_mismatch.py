"""One rank issues a different collective than the others at the same seq.

    incident_mismatch.py MODE WARMUP CULPRIT

Every rank runs WARMUP all_reduces of 1024 floats; then the others all_reduce
1024 floats again while rank CULPRIT (MODE `size`) all_reduces 512 floats or
(MODE `op`) all_gathers 1024 floats. What gloo does with that is up to gloo
(an error, a hang until the group timeout, or a wrong result); the job must
dump either way. Every rank prints `OUTCOME <rank> <what happened>`.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> int:
    mode, warmup, culprit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    timeout_s = float(os.environ.get("INCIDENT_PG_TIMEOUT", "4"))
    dist.init_process_group(backend="frnccl", timeout=timedelta(seconds=timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1024)
    for _ in range(warmup):
        dist.all_reduce(t)
    try:
        if rank != culprit:
            dist.all_reduce(torch.ones(1024))
        elif mode == "size":
            dist.all_reduce(torch.ones(512))
        else:
            dist.all_gather([torch.empty(1024) for _ in range(world)], torch.ones(1024))
        print(f"OUTCOME {rank} returned", flush=True)
    except Exception as err:  # gloo noticed
        print(f"OUTCOME {rank} raised {type(err).__name__}: {str(err).splitlines()[0][:200]}", flush=True)
        raise
    # A rank whose mismatched op "succeeded" must not leave before the others
    # time out and the job-wide dump has reached it; the next collective would
    # hang anyway, so wait in it, as a real job would.
    dist.all_reduce(t)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
