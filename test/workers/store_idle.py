"""An idle frnccl job whose every store connection goes through the test's proxy.

    store_idle.py STORE_PORT

The test hosts the job's TCPStore and a counting proxy in front of it (store_proxy.py); STORE_PORT is the
proxy's. Each rank builds its group on that store, runs a few all_reduces, prints `READY <rank>`, then
stays idle, its main thread blocked in one wait() on `test/done` (sent before the test's idle window), until
the test sets that key. Then it destroys the group and prints `DONE <rank>`.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> int:
    store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=timedelta(seconds=120),
                          wait_for_workers=False)
    dist.init_process_group("frnccl", store=store, rank=RANK, world_size=WORLD, timeout=timedelta(seconds=30))
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    store.add("test/ready", 1)
    say(f"READY {RANK}")
    store.wait(["test/done"])
    dist.destroy_process_group()
    say(f"DONE {RANK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
