"""A training-like loop for the metrics tests.

    metrics_job.py STATE_DIR

Every rank runs all_reduce until the file STATE_DIR/stop appears (rank 0 looks, and the others learn it
through the all_reduce, so every rank stops after the same op) or MAX_S passed. Rank SLOW_RANK (env, default
none) sleeps SLOW_S seconds before each op: the rank the others wait for. Rank STALL_RANK sleeps until
STATE_DIR/unstall appears (at most 60 s) before its op number STALL_AT: the others' group stalls meanwhile.
With FORK_CHILD=1, rank 0 waits after its first op for STATE_DIR/fork_now (at most 60 s), then forks a child
that exits at once through sys.exit(0), as a DataLoader worker may, and prints `CHILD_EXITED <status>
<seconds>`. Once its first op completed, rank 0
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


def fork_and_wait(state: Path) -> None:
    until = time.monotonic() + 60
    while not (state / "fork_now").exists() and time.monotonic() < until:
        time.sleep(0.05)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # runs the child's atexit handlers, inherited from the parent
    deadline = started + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            print(f"CHILD_EXITED {os.waitstatus_to_exitcode(status)} {time.monotonic() - started:.2f}", flush=True)
            return
        time.sleep(0.02)
    os.kill(pid, 9)
    print("CHILD_EXITED hung 30", flush=True)


def main() -> int:
    state = Path(sys.argv[1])
    dist.init_process_group("frnccl")
    rank = dist.get_rank()
    slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
    slow_s = float(os.environ.get("SLOW_S", "0"))
    stall_rank = int(os.environ.get("STALL_RANK", "-1"))
    stall_at = int(os.environ.get("STALL_AT", "0"))
    end = time.monotonic() + MAX_S
    ops = 0
    flag = torch.zeros(1)
    while True:
        if rank == slow_rank:
            time.sleep(slow_s)
        if rank == stall_rank and ops + 1 == stall_at:
            until = time.monotonic() + 60
            while not (state / "unstall").exists() and time.monotonic() < until:
                time.sleep(0.05)
        flag.fill_(1.0 if rank == 0 and ((state / "stop").exists() or time.monotonic() > end) else 0.0)
        dist.all_reduce(flag)
        ops += 1
        if ops == 1 and rank == 0:
            if os.environ.get("FORK_CHILD") == "1":
                fork_and_wait(state)
            (state / "running").write_text("1")
        if flag.item() > 0:
            break
    dist.destroy_process_group()
    sys.stdout.write("RESULT " + json.dumps({"rank": rank, "ops": ops}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
