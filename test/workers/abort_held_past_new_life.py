"""A timeout's abort that is still on its way when the job starts a new life must reach the old life's groups
only. FRNCCL_TEST_HOLD_ABORT holds rank 0's abort open right after it checked the life; meanwhile the job
tears its groups down and starts a new life on a second address (NEW_INIT_METHOD); then the abort goes on,
and the new life's ops must run.

Rank 0 issues an all_reduce that rank 1 never joins; once rank 0's watchdog timed it out (2 s) and its
incident reached the abort, both ranks tear down, start the new life, let the abort go, wait for it to
finish, and run the new life's ops: `NEW_LIFE_OPS <sum>`.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

HOLD = os.environ["FRNCCL_TEST_HOLD_ABORT"]


def wait_for_file(suffix: str) -> None:
    path = Path(HOLD + suffix)
    end = time.monotonic() + 60
    while not path.exists():
        if time.monotonic() > end:
            raise SystemExit(f"no {path} after 60 s")
        time.sleep(0.02)


def main() -> int:
    dist.init_process_group("frnccl", timeout=timedelta(seconds=2))
    rank = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        wait_for_file(".held")
        end = time.monotonic() + 30
        while not work.is_completed() and time.monotonic() < end:
            time.sleep(0.02)
        print(f"OLD_OP_COMPLETED {work.is_completed()}", flush=True)
    else:
        wait_for_file(".held")  # never joins that op: Gloo's own timeout (the group's) fails it on rank 0
    dist.destroy_process_group()
    dist.init_process_group("frnccl", init_method=os.environ["NEW_INIT_METHOD"], rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    if rank == 0:
        Path(HOLD + ".go").touch()
    wait_for_file(".done")
    total = 0.0
    for _ in range(3):
        x = torch.ones(4)
        dist.all_reduce(x)
        total += float(x.sum())
    print(f"NEW_LIFE_OPS {total:g}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
