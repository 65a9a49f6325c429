"""A failure outside any collective, as a quorum's timeout is (torchft), or a lighthouse that cannot be reached.

    outside_collectives.py RAISER [all|late]

Every rank runs one barrier; then rank RAISER raises TimeoutError from wait_for_quorum (uncaught: it leaves
the job), while the others wait in wait_for_quorum, outside any collective, until a verdict.json appears
under FRNCCL_DUMP_DIR (the raiser's incident was judged) or 30 s passed, and leave cleanly; with `all`, their
quorum then times out too: each raises TimeoutError as it leaves; with `late`, they go on, past the time in
which frnccl takes any failure of theirs for a cascade of the raiser's incident (twice FRNCCL_DUMP_TIMEOUT_SEC),
into an all_reduce, which fails: the raiser has left. $QUORUM_MESSAGE, if set, is the raiser's message.
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
        raise TimeoutError(os.environ.get("QUORUM_MESSAGE", "quorum not reached within 5 s"))  # RAISES:quorum
    dumps = Path(os.environ["FRNCCL_DUMP_DIR"])
    end = time.monotonic() + 30
    while time.monotonic() < end and not any(dumps.glob("*/verdict.json")):
        time.sleep(0.05)  # WAITS:quorum
    if mode == "all":
        raise TimeoutError(f"rank {rank}: quorum not reached either")  # RAISES:later


def main() -> int:
    raiser = int(sys.argv[1])
    dist.init_process_group("frnccl")
    rank = dist.get_rank()
    dist.barrier()
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    wait_for_quorum(rank, raiser, mode)
    if mode == "late":
        time.sleep(2 * float(os.environ["FRNCCL_DUMP_TIMEOUT_SEC"]) + 0.5)  # the scenario: later than a cascade
        dist.all_reduce(torch.ones(4))  # FAILS:late
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
