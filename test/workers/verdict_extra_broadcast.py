"""The last step's op pattern differs from the earlier ones: a pair's extra broadcast comes before the final
world all_reduce, and the pair's root hangs before it.

    verdict_extra_broadcast.py STEPS CULPRIT PEER

Every rank runs STEPS steps of (the pair's broadcast from CULPRIT, a world all_reduce); the pair is
[CULPRIT, PEER], a group of its own (the other ranks only create it). In the last step the pair broadcasts
twice: CULPRIT sleeps before the extra broadcast, so PEER waits in it for CULPRIT only, and the other ranks
wait in the final world all_reduce for both. PEER's own history (every earlier step issued the world
all_reduce right after the pair's broadcast) does not make it the rank that skipped the world all_reduce:
it waits for CULPRIT.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

STUCK_S = 60  # the harness stops the culprit once the others have failed


def main() -> int:
    steps, culprit, peer = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    timeout = timedelta(seconds=float(os.environ.get("INCIDENT_PG_TIMEOUT", "4")))
    dist.init_process_group(backend="frnccl", timeout=timeout)
    rank = dist.get_rank()
    pair = dist.new_group([culprit, peer], timeout=timeout, group_desc="pair")  # every rank creates it
    t = torch.ones(256)
    b = torch.ones(16)
    for step in range(steps + 1):
        last = step == steps
        if rank in (culprit, peer):
            dist.broadcast(b, src=culprit, group=pair)
            if last:
                if rank == culprit:
                    print(f"rank {rank} stuck before the extra broadcast", flush=True)
                    time.sleep(STUCK_S)  # STUCK:extra
                dist.broadcast(b, src=culprit, group=pair)  # the peer waits here for the culprit
        dist.all_reduce(t)  # the other ranks wait here, in the last step
    print(f"rank {rank} UNEXPECTEDLY passed the last step", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
