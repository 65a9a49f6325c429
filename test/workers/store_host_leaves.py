"""An env:// job whose store host (rank 0's process) leaves first, without a teardown.

    store_host_leaves.py

Rank 0 ends with os._exit after an all_reduce, once every rank answered a status request (its monitor idle);
its TCPStore server goes with it. Every other rank, idle,
waits until the store's port refuses a connection, stays idle 1 s more, then destroys its group and
prints `DONE <rank>`.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def host_gone() -> bool:
    try:
        socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), timeout=1).close()
        return False
    except OSError:
        return True


def main() -> int:
    dist.init_process_group("frnccl", rank=RANK, world_size=WORLD)
    dist.all_reduce(torch.ones(4))
    if RANK == 0:
        # Leaves once every rank answered a status request: each rank's monitor is then idle (its first look
        # in the store done), which is the case this job is about. A host that dies in the middle of a store
        # call of the monitor's still gets torch's backtrace from that call.
        from fr_backend.status import ask

        status = ask(f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", WORLD, 60)
        assert not status.missing(), status
        os._exit(0)
    end = time.monotonic() + 60
    while not host_gone() and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(1.0)
    dist.destroy_process_group()
    print(f"DONE {RANK}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
