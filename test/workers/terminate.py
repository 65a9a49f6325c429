"""Two ranks loop over all_reduces until told to stop; the test sends rank 1 SIGTERM.

    terminate.py MODE STATE_DIR

MODE `default`: nothing of the program's own handles SIGTERM.
MODE `handler`: the program installed its own SIGTERM handler (Python's signal.signal) before its first group;
the handler asks the loop to end, and rank 1 prints `HANDLED` once it ran; both ranks then exit normally.
MODE `handler_after`: the same handler, installed after the first group exists (as Lightning's fit does).
MODE `survives`: a handler installed after the first group that only writes STATE_DIR/handled_<rank>_<n> for
its n-th SIGTERM; the loop goes on until STATE_DIR/stop exists.
MODE `gil`: after its first all_reduce each rank writes STATE_DIR/pid_<rank>, then its main thread sits in a C
call that holds the GIL (libc sleep() through ctypes.PyDLL) until the test ends the process: a dump can take the GIL
only from another thread, never from this one.
After its first all_reduce, each rank writes STATE_DIR/pid_<rank>, and rank 0 then STATE_DIR/running.
Every rank prints `DONE <rank>` at a normal end.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

MAX_S = 60.0
stop_asked = False


def on_term(signum: int, frame: object) -> None:
    global stop_asked
    stop_asked = True


terms_seen = 0


def count_term(state: Path, rank: int) -> None:
    global terms_seen
    terms_seen += 1
    (state / f"handled_{rank}_{terms_seen}").write_text("1")


def main() -> int:
    mode, state = sys.argv[1], Path(sys.argv[2])
    if mode == "handler":
        signal.signal(signal.SIGTERM, on_term)
    dist.init_process_group(backend="frnccl", timeout=timedelta(seconds=30))
    if mode == "handler_after":
        signal.signal(signal.SIGTERM, on_term)
    rank = dist.get_rank()
    if mode == "survives":
        signal.signal(signal.SIGTERM, lambda signum, frame: count_term(state, rank))
    flag = torch.zeros(1)
    end = time.monotonic() + MAX_S
    n = 0
    while True:
        flag.fill_(1.0 if stop_asked or time.monotonic() > end or (state / "stop").exists() else 0.0)
        dist.all_reduce(flag)  # a stop asked on one rank reaches both
        n += 1
        if n == 1:
            (state / f"pid_{rank}").write_text(str(os.getpid()))
            if rank == 0:
                (state / "running").write_text("1")
            if mode == "gil":
                # The dump signal goes to another thread: on this one it would end sleep() early.
                signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
                ctypes.PyDLL(None).sleep(int(MAX_S))  # holds the GIL throughout; the test ends the process first
                return 1
        if flag.item() > 0:
            break
        time.sleep(0.02)
    if stop_asked:
        print(f"HANDLED {rank}", flush=True)
    dist.destroy_process_group()
    print(f"DONE {rank}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
