"""The dump signal (SIGUSR1) in a program that has handlers of its own, or no frnccl group.

    signal_chain.py MODE STATE_DIR

MODE `no_group`: under FRNCCL_ENABLE=1 the process imports torch, makes no group, and sends its own main thread
SIGUSR1 (delivered before pthread_kill returns, as `kill -USR1 <pid>` would be delivered to it); it then prints
`DONE <rank>` and exits 0, if the signal left it alive.
MODE `handler_before` / `handler_after`: the program installs a SIGUSR1 handler of its own with signal.signal
(as Slurm's --signal users and Lightning's auto-requeue do) before or after init_process_group("gloo"), runs one
all_reduce, writes STATE_DIR/pid_<rank>, and waits for STATE_DIR/stop. Its handler writes
STATE_DIR/handled_<rank>. Every rank prints `DONE <rank>` at a normal end.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

MAX_S = 90.0
mode, state = sys.argv[1], Path(sys.argv[2])
rank = int(os.environ["RANK"])


def on_usr1(signum: int, frame: object) -> None:
    (state / f"handled_{rank}").write_text("1")


def wait_for_stop() -> None:
    end = time.monotonic() + MAX_S
    while not (state / "stop").exists() and time.monotonic() < end:
        time.sleep(0.05)


if mode == "no_group":
    signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
    print(f"DONE {rank}", flush=True)
    sys.exit(0)
if mode == "handler_before":
    signal.signal(signal.SIGUSR1, on_usr1)
dist.init_process_group("gloo")
if mode == "handler_after":
    signal.signal(signal.SIGUSR1, on_usr1)
dist.all_reduce(torch.ones(1))
(state / f"pid_{rank}").write_text(str(os.getpid()))
wait_for_stop()
dist.destroy_process_group()
print(f"DONE {rank}", flush=True)
