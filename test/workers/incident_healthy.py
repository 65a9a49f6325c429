"""A healthy job, for dumps on request and clean exits.

    incident_healthy.py MODE STATE_DIR

MODE `run`: loop all_reduce until the file STATE_DIR/stop appears (rank 0
decides, the others follow through the all_reduce) or MAX_S seconds passed, then
exit normally. Once the loop runs, every rank writes STATE_DIR/pid_<rank> and
rank 0 writes STATE_DIR/master_port (its MASTER_PORT) and then
STATE_DIR/running.
MODE `local`: a few all_reduces, then rank LOCAL_DUMPER calls fr_backend.dump()
and prints `LOCAL_DUMP <folder>`, then a few more, then exit.
MODE `clean`: a few all_reduces, an idle pause, then destroy_process_group;
prints `DESTROY_S <seconds>` (how long destroy_process_group took).
Every rank prints `DONE <rank> <iterations>` and, as its last line,
`DONE_MONO <time.monotonic()>`.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

MAX_S = 30.0
LOCAL_DUMPER = 1


def say(line: str) -> None:
    """One write per line: under torchrun every rank shares the launcher's stdout,
    and print() writes the text and the newline separately."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run(state: Path, rank: int) -> int:
    flag = torch.zeros(1)
    n = 0
    end = time.monotonic() + MAX_S
    while True:
        flag.zero_()
        if rank == 0 and (state / "stop").exists() or time.monotonic() > end:
            flag.fill_(1.0)
        dist.all_reduce(flag)  # rank 0's stop decision reaches every rank
        n += 1
        if n == 1:
            (state / f"pid_{rank}").write_text(str(os.getpid()))
            if rank == 0:  # the store the ranks use (torchrun: not the rendezvous endpoint)
                (state / "master_port").write_text(os.environ["MASTER_PORT"])
                (state / "running").write_text("1")
        if flag.item() > 0:
            return n
        time.sleep(0.05)


def main() -> int:
    mode, state = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group(backend="frnccl", timeout=timedelta(seconds=30))
    rank = dist.get_rank()
    t = torch.ones(256)
    if mode == "run":
        n = run(state, rank)
        dist.destroy_process_group()
    elif mode == "local":
        for _ in range(3):
            dist.all_reduce(t)
        if rank == LOCAL_DUMPER:
            import fr_backend

            say(f"LOCAL_DUMP {fr_backend.dump()}")
        for _ in range(3):
            dist.all_reduce(t)
        n = 6
        dist.destroy_process_group()
    elif mode == "clean":
        for _ in range(5):
            dist.all_reduce(t)
        time.sleep(1.0)  # idle: nothing in flight, the frnccl threads back off
        start = time.monotonic()
        dist.destroy_process_group()
        say(f"DESTROY_S {time.monotonic() - start:.3f}")
        n = 5
    else:
        raise SystemExit(f"unknown mode {mode}")
    say(f"DONE {rank} {n}")
    say(f"DONE_MONO {time.monotonic()}")  # CLOCK_MONOTONIC: comparable across processes
    return 0


if __name__ == "__main__":
    sys.exit(main())
