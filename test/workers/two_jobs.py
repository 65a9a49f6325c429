"""One of two jobs that share a dump folder: WARMUP all_reduces, then rank 1 hangs while rank 0 waits for it.

    two_jobs.py WARMUP STATE_DIR

Rank 0 issues all_reduce number WARMUP+1 (async, so that it is recorded before the rank says so) and waits in it;
rank 1 sleeps instead. Each rank then writes STATE_DIR/pid_<rank>: the hang is in place, and the test ends the
job with SIGTERM, as a scheduler ends a hung job (each rank dumps on it). The group's timeout (60 s) never passes.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> int:
    warmup, state = int(sys.argv[1]), Path(sys.argv[2])
    dist.init_process_group(backend="frnccl", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    t = torch.ones(16)
    for _ in range(warmup):
        dist.all_reduce(t)
    work = dist.all_reduce(t, async_op=True) if rank == 0 else None
    (state / f"pid_{rank}.tmp").write_text(str(os.getpid()))
    os.replace(state / f"pid_{rank}.tmp", state / f"pid_{rank}")  # whole when the test sees it
    if work is not None:
        work.wait()
    else:
        time.sleep(60)  # the hang: rank 0 waits for this rank in all_reduce WARMUP+1
    return 1


if __name__ == "__main__":
    sys.exit(main())
