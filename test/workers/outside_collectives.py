"""A failure outside any collective, as a quorum's timeout is (torchft), or a lighthouse that cannot be reached.

    outside_collectives.py RAISER [all|late|behind]

Every rank runs one barrier; then rank RAISER raises TimeoutError from wait_for_quorum (uncaught: it leaves
the job), while the others wait in wait_for_quorum, outside any collective, until a verdict.json appears
under FRNCCL_DUMP_DIR (the raiser's incident was judged) or 30 s passed, and leave cleanly; with `all`, their
quorum then times out too: each raises TimeoutError as it leaves; with `late`, they go on, past the time in
which frnccl takes any failure of theirs for a cascade of the raiser's incident (twice FRNCCL_DUMP_TIMEOUT_SEC),
into an all_reduce, which fails: the raiser has left. $QUORUM_MESSAGE, if set, is the raiser's message. With `behind`, only rank
RAISER + 1 waits in wait_for_quorum (then leaves cleanly); the others go into an all_reduce at once (the raiser
first waits for them to say so in the store), where they wait for the raiser and that rank.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def wait_for_quorum(rank: int, raiser: int, mode: str) -> None:
    if rank == raiser:
        if mode == "behind":
            dist.distributed_c10d._get_default_store().wait([f"in_all_reduce_{r}" for r in _in_all_reduce(raiser)])
        raise TimeoutError(os.environ.get("QUORUM_MESSAGE", "quorum not reached within 5 s"))  # RAISES:quorum
    dumps = Path(os.environ["FRNCCL_DUMP_DIR"])
    end = time.monotonic() + 30
    while time.monotonic() < end and not any(dumps.glob("*/verdict.json")):
        time.sleep(0.05)  # WAITS:quorum
    if mode == "all":
        raise TimeoutError(f"rank {rank}: quorum not reached either")  # RAISES:later


def _in_all_reduce(raiser: int) -> list[int]:
    return [r for r in range(dist.get_world_size()) if r not in (raiser, (raiser + 1) % dist.get_world_size())]


def main() -> int:
    raiser = int(sys.argv[1])
    dist.init_process_group("frnccl")
    rank = dist.get_rank()
    dist.barrier()
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    if mode == "behind" and rank in _in_all_reduce(raiser):
        dist.distributed_c10d._get_default_store().set(f"in_all_reduce_{rank}", "1")
        dist.all_reduce(torch.ones(4))  # FAILS:behind (the raiser leaves)
    wait_for_quorum(rank, raiser, mode)
    if mode == "late":
        time.sleep(2 * float(os.environ["FRNCCL_DUMP_TIMEOUT_SEC"]) + 0.5)  # the scenario: later than a cascade
        dist.all_reduce(torch.ones(4))  # FAILS:late
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
