"""A rank is killed with SIGKILL between two collectives.

    incident_kill.py WARMUP VICTIM [LATE_RANK LATE_S]

Every rank runs WARMUP all_reduces; then rank VICTIM sends itself SIGKILL (no
atexit, no dump) while the others enter all_reduce number WARMUP+1: rank 0
waits on its Work, the others on the Work's future (the path DDP's hooks use).
Rank LATE_RANK, if given, sleeps LATE_S seconds before it enters, so its own
failure comes after the incident the others opened has ended.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch.distributed as dist

from _incident import warmed_up_group


def main() -> int:
    warmup, killed = int(sys.argv[1]), int(sys.argv[2])
    late_rank, late_s = (int(sys.argv[3]), float(sys.argv[4])) if len(sys.argv) > 4 else (-1, 0.0)
    rank, t = warmed_up_group(warmup)
    if rank == killed:
        print(f"rank {rank} kills itself", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == late_rank:
        time.sleep(late_s)
    try:
        if rank == 0:
            dist.all_reduce(t)
        else:
            dist.all_reduce(t, async_op=True).get_future().wait()
        print(f"OUTCOME {rank} returned", flush=True)
    except Exception as err:
        print(f"OUTCOME {rank} raised {type(err).__name__}: {str(err).splitlines()[0][:200]}", flush=True)
        return 3
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
