"""The job of the restart loop in docs/usage.md ("Restarting without the culprit's host"), under torchrun.

    restart_job.py STUCK_RANK

Every rank runs a few all_reduces; rank STUCK_RANK stands for a bad host: it stops before the next one
(the others time out) unless its host is listed in EXCLUDED_HOSTS, which the loop sets for the next run
as a Slurm `--exclude` would move the job off that host. A clean run prints "RUN CLEAN" on rank 0.
With RESTART_JOB_ON_VERDICT=DIR, each rank keeps what fr_backend.on_verdict handed it in DIR/rank_<R>.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

from _incident import warmed_up_group

STUCK_S = 60


def record_verdicts(rank: int) -> None:
    """RESTART_JOB_ON_VERDICT=DIR: each verdict fr_backend.on_verdict hands this rank goes to DIR/rank_<R>."""
    folder = os.environ.get("RESTART_JOB_ON_VERDICT")
    if not folder:
        return
    import fr_backend

    def keep(v) -> None:
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".rank_{rank}")
        with open(tmp, "w") as f:
            json.dump({"incident_id": v.incident_id, "kind": v.kind, "culprit_ranks": list(v.culprit_ranks),
                       "culprit_hosts": list(v.culprit_hosts)}, f)
        os.replace(tmp, os.path.join(folder, f"rank_{rank}"))

    fr_backend.on_verdict(keep)


def await_own_verdict(rank: int, bound_s: float = 10.0) -> None:
    """With RESTART_JOB_ON_VERDICT: before this rank leaves on its error, its callback has had the verdict
    (bounded: a rank whose callback never ran leaves anyway, and the test says which)."""
    folder = os.environ.get("RESTART_JOB_ON_VERDICT")
    deadline = time.monotonic() + bound_s
    while folder and time.monotonic() < deadline and not os.path.exists(os.path.join(folder, f"rank_{rank}")):
        time.sleep(0.05)


def main() -> int:
    stuck = int(sys.argv[1])
    rank, t = warmed_up_group(3)
    record_verdicts(rank)
    print(f"rank {rank} pid {os.getpid()} host {socket.gethostname()}", flush=True)
    excluded = [h for h in os.environ.get("EXCLUDED_HOSTS", "").split(",") if h]
    if rank == stuck and socket.gethostname() not in excluded:
        time.sleep(STUCK_S)  # the bad host
    try:
        dist.all_reduce(t)
    except Exception:
        await_own_verdict(rank)
        raise
    if rank == 0:
        print(f"RUN CLEAN: {t[0].item():.0f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
