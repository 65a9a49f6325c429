"""A training-like loop for the metrics tests.

    metrics_job.py STATE_DIR

Every rank runs all_reduce until the file STATE_DIR/stop appears (rank 0 looks, and the others learn it
through the all_reduce, so every rank stops after the same op) or MAX_S passed. Rank SLOW_RANK (env, default
none) sleeps SLOW_S seconds before each op: the rank the others wait for. Once its first op completed, rank 0
writes STATE_DIR/running. Each rank prints a RESULT line: its ops.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

MAX_S = 90.0


def main() -> int:
    state = Path(sys.argv[1])
    dist.init_process_group("frnccl")
    rank = dist.get_rank()
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    slow_s = float(os.environ.get("SLOW_S", "0"))
    end = time.monotonic() + MAX_S
    ops = 0
    flag = torch.zeros(1)
    while True:
        if rank == slow_rank:
            time.sleep(slow_s)
        flag.fill_(1.0 if rank == 0 and ((state / "stop").exists() or time.monotonic() > end) else 0.0)
        dist.all_reduce(flag)
        ops += 1
        if ops == 1 and rank == 0:
            (state / "running").write_text("1")
        if flag.item() > 0:
            break
    dist.destroy_process_group()
    sys.stdout.write("RESULT " + json.dumps({"rank": rank, "ops": ops}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
