"""One rank fails and exits while the other is alive but stalled forever (issue #44 item 1).

    exit_after_failure.py BACKEND ENDING STALL

BACKEND: frnccl, or gloo (an unmodified gloo script: the test runs it under FRNCCL_ENABLE=1).
Both ranks make a group with a short timeout (SHORT_TIMEOUT_S) and warm it up. Then the failing rank
(FAILING_RANK, 0 by default: the store's host) fails and the other stalls; the failing rank prints
`RAISED_MONO <t>` (time.monotonic(), one clock for every process of the machine) at the moment its failure
is raised, and from then on only its exit runs.

ENDING (the failing rank):
  uncaught  the group's all_reduce times out (the other never joins it) and its error ends the program
  exit1     the same error, caught; the script calls sys.exit(1)
  own       its own uncaught exception outside collectives (its exit opens an incident)
STALL (the other rank), after printing `STALLING`:
  sleep       time.sleep forever (the GIL free)
  gil         a C sleep that holds the GIL forever
  collective  inside an all_reduce on the default group (600 s timeout) that the failing rank never joins
  frozen      time.sleep forever; the test freezes the process (SIGSTOP) once it says STALLING
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

BACKEND, ENDING, STALL = sys.argv[1], sys.argv[2], sys.argv[3]
SHORT_TIMEOUT_S = float(os.environ.get("SHORT_TIMEOUT_S", "2"))
RANK = int(os.environ["RANK"])
# The rank that fails (0 by default); the other stalls. With 1, the stalled rank is the store's host.
FAILER = int(os.environ.get("FAILING_RANK", "0"))


def stall() -> None:
    print("STALLING", flush=True)
    if STALL == "gil":
        ctypes.PyDLL(None).sleep(10**6)  # a PyDLL call keeps the GIL
    elif STALL == "collective":
        dist.all_reduce(torch.ones(4))
    time.sleep(10**6)


def main() -> None:
    dist.init_process_group(BACKEND, init_method="env://", timeout=timedelta(seconds=600))
    short = dist.new_group([0, 1], timeout=timedelta(seconds=SHORT_TIMEOUT_S))
    x = torch.ones(4)
    dist.all_reduce(x)
    dist.all_reduce(x, group=short)
    if RANK != FAILER:
        stall()
        return
    if ENDING == "own":
        print(f"RAISED_MONO {time.monotonic()}", flush=True)
        raise ValueError("this rank's own failure outside collectives")
    try:
        dist.all_reduce(x, group=short)
    except Exception:
        print(f"RAISED_MONO {time.monotonic()}", flush=True)
        if ENDING == "exit1":
            sys.exit(1)
        raise
    print("the other rank joined an all_reduce it should not have", flush=True)
    sys.exit(3)


main()
