"""One rank never joins a collective; the others time out and the job dumps.

    incident_hang.py MODE WARMUP CULPRIT

Every rank runs WARMUP all_reduces; then rank CULPRIT gets stuck (MODE: `sleep`
in time.sleep, `busy` in a Python spin loop, `gil` in a C call that holds the
GIL) while the others enter all_reduce number WARMUP+1 and time out after the
group timeout (INCIDENT_PG_TIMEOUT seconds). Each stuck line carries a
`STUCK:<mode>` marker the test looks for in the culprit's thread stacks.
With INCIDENT_NEXT_CALLS_S=S, a victim whose call failed calls again for up
to S seconds, until a call fails because frnccl aborted the groups after the dump.
With INCIDENT_OP=reduce_scatter_tensor, the victims wait in that op instead: on torch
2.11-2.13 its Gloo Work cannot report completion, so the incident comes from the
failure of the victims' wait at Gloo's own timeout.
With INCIDENT_CULPRIT_ENTRIES=N, the culprit first records N ops issued from a
deep Python stack on a group of its own, so its dump is the slowest to write
(every rank creates every such group, then all meet in a barrier).
With INCIDENT_VICTIM_EXIT=catch, a victim catches its error, prints it and calls sys.exit(1).
With INCIDENT_STUCK_S=S, the culprit is stuck S seconds (default 60), then calls the op the others timed out
in, as a stalled rank that wakes does: its call fails, and it leaves with that error.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from _incident import warmed_up_group

STUCK_S = float(os.environ.get("INCIDENT_STUCK_S", "60"))  # then the culprit calls the op too


def stuck_sleep() -> None:
    time.sleep(STUCK_S)  # STUCK:sleep


def stuck_busy() -> None:
    end = time.monotonic() + STUCK_S
    while time.monotonic() < end: pass  # STUCK:busy  # noqa: E701


def stuck_gil() -> None:
    ctypes.PyDLL(None).sleep(int(STUCK_S))  # STUCK:gil (libc sleep(), GIL held throughout)


STUCK = {"sleep": stuck_sleep, "busy": stuck_busy, "gil": stuck_gil}


def try_next_calls(rank: int, t) -> None:
    """INCIDENT_NEXT_CALLS_S > 0: once this rank's dump is written, call again (every 0.2 s, for at
    most that many seconds in all) until a call raises because frnccl aborted the groups after the
    timeout's dump; print what each call did. Until the abort, gloo fails them at once: the timeout
    closed its pairs."""
    deadline = time.monotonic() + float(os.environ.get("INCIDENT_NEXT_CALLS_S", "0"))
    # Not before this rank's dump is written, so the dump still ends at the op that timed out.
    mine = f"*/compact/frnccl_rank_{rank}.json.gz"
    while time.monotonic() < deadline and not any(Path(os.environ["FRNCCL_DUMP_DIR"]).glob(mine)):
        time.sleep(0.05)
    while time.monotonic() < deadline:
        try:
            dist.all_reduce(t)
            print(f"NEXT_CALL {rank} returned", flush=True)
        except Exception as err:
            first = str(err).splitlines()[0]
            print(f"NEXT_CALL {rank} raised {type(err).__name__}: {first}", flush=True)
            if "was aborted" in first:
                return
        time.sleep(0.2)


def fill_culprit(rank: int, culprit: int) -> None:
    n = int(os.environ.get("INCIDENT_CULPRIT_ENTRIES", "0"))
    if n <= 0:
        return
    solos = [dist.new_group([r]) for r in range(dist.get_world_size())]  # new_group is collective
    if rank == culprit:
        t = torch.ones(4)

        def issue(depth: int) -> None:
            if depth > 0:
                issue(depth - 1)
                return
            for _ in range(n):
                dist.all_reduce(t, group=solos[rank])

        issue(60)
    dist.barrier()


def main() -> int:
    mode, warmup, culprit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rank, t = warmed_up_group(warmup)
    fill_culprit(rank, culprit)
    print(f"rank {rank} warmed up", flush=True)
    if rank == culprit:
        STUCK[mode]()
    try:
        if os.environ.get("INCIDENT_OP") == "reduce_scatter_tensor":
            world = dist.get_world_size()
            dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * world))  # the victims wait here for the culprit
        else:
            dist.all_reduce(t)  # the victims wait here for the culprit
    except Exception as err:
        try_next_calls(rank, t)
        if os.environ.get("INCIDENT_VICTIM_EXIT") == "catch":  # as most training loops do: log it, exit 1
            print(f"rank {rank} caught {type(err).__name__}: {str(err).splitlines()[0]}", flush=True)
            sys.exit(1)
        raise
    print(f"rank {rank} UNEXPECTEDLY passed the collective", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
