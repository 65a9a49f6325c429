"""A plain gloo job (no frnccl) recorded by torch's own flight recorder only, with one fault; each rank writes
torch's dump with `_dump_fr_trace_file` after its own gloo error, as torch leaves things.

Usage (env://, 4 ranks): torch215_recorder.py SHAPE TIMEOUT_S
Groups {0,1} and {2,3} (each rank creates both). Each step: an all_reduce in the rank's pair, then one in the
world group. At step FAULT_STEP:
  skip   rank 3 skips its pair all_reduce and goes on to the world all_reduce;
  hang   rank 1 hangs in compute before its pair all_reduce, until the other ranks have dumped (then it
         dumps too: what a hung rank's dump would hold);
  size   rank 3's pair all_reduce has twice the elements of rank 2's (gloo may end rank 2's process
         outright: then it leaves no dump).
The dumps go to TORCH_FR_DUMP_TEMP_FILE<rank> (torch's own naming). A rank waits, bounded, for the others'
dumps before it exits: a peer's exit would otherwise end a rank's op with "connection closed" first.
Prints `STEP <rank> <n>`, `ERROR <rank> <text>` and `DUMPED <rank>`.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

SKIPPER = 3
HANGER = 1
MISMATCHER = 3
FAULT_STEP = 6
STEPS = 10
WAIT_S = 120  # at most, for the other ranks' dumps


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def wait_for_dumps(prefix: str, ranks: list[int]) -> None:
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end and not all(os.path.exists(f"{prefix}{r}") for r in ranks):
        time.sleep(0.05)


def main() -> None:
    shape, timeout = sys.argv[1], timedelta(seconds=float(sys.argv[2]))
    prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
    dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    rank = dist.get_rank()
    pairs = [dist.new_group([0, 1], timeout=timeout), dist.new_group([2, 3], timeout=timeout)]
    mine = pairs[rank // 2]
    # in the size shape gloo may end rank 2 outright (its receive is larger than its buffer): not waited for
    others = [r for r in range(4) if r != rank and not (shape == "size" and r == 2)]
    try:
        for step in range(1, STEPS + 1):
            t = torch.ones(8)
            if step == FAULT_STEP and shape == "hang" and rank == HANGER:
                wait_for_dumps(prefix, others)  # the hung compute: until everyone else gave up and dumped
                break
            if not (step == FAULT_STEP and shape == "skip" and rank == SKIPPER):
                if step == FAULT_STEP and shape == "size" and rank == MISMATCHER:
                    t = torch.ones(16)
                dist.all_reduce(t, group=mine)
            dist.all_reduce(torch.ones(4))
            say(f"STEP {rank} {step}")
    except RuntimeError as exc:
        say(f"ERROR {rank} {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}")
    torch._C._distributed_c10d._dump_fr_trace_file(rank)
    say(f"DUMPED {rank}")
    wait_for_dumps(prefix, others)
    # torch's gloo threads can abort a failed job at interpreter exit; what is tested is on disk already
    os._exit(0)


if __name__ == "__main__":
    main()
