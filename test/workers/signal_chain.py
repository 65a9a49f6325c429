"""The dump signal (SIGUSR1) in a program that has handlers of its own, or no frnccl group.

    signal_chain.py MODE STATE_DIR

MODE `no_group`: under FRNCCL_ENABLE=1 the process imports torch, makes no group, and sends its own main thread
SIGUSR1 (delivered before pthread_kill returns, as `kill -USR1 <pid>` would be delivered to it); it then prints
`DONE <rank>` and exits 0, if the signal left it alive.
MODE `faulthandler_abort`: after init, faulthandler.enable() (a C handler in front of frnccl's SIGABRT handler,
which hands the signal back to it), then any signal.signal call, then os.abort(): the process must end by SIGABRT.
MODE `blocked_read`: after init, a SIGTERM handler (signal.signal) that writes STATE_DIR/handled_<rank> and ends
the read below; the main thread then blocks in os.read on a pipe (a backstop writes it after 30 s). Python runs
the handler during the read only if the signal interrupts it (EINTR, as without frnccl).
MODE `fork_usr1`: after init, a forked child sends itself SIGUSR1 and exits 0 if it survived; the parent
prints `CHILD <exit code>`.
MODE `ignored_usr1`: the process re-executes itself with SIGUSR1 ignored (inherited across exec, as from a
launcher), makes its group and sends its main thread SIGUSR1: still ignored.
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
if mode == "ignored_usr1" and os.environ.get("SIGNAL_CHAIN_REEXECUTED") != "1":
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "SIGNAL_CHAIN_REEXECUTED": "1"})
if mode in ("faulthandler_abort", "blocked_read", "fork_usr1", "ignored_usr1"):
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    if mode == "faulthandler_abort":
        import faulthandler

        faulthandler.enable()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.abort()
    if mode == "blocked_read":
        read_end, write_end = os.pipe()

        def on_term(signum: int, frame: object) -> None:
            (state / f"handled_{rank}").write_text("1")
            os.write(write_end, b"x")  # ends the read: the handler ran while the main thread was blocked

        signal.signal(signal.SIGTERM, on_term)
        backstop = threading.Timer(30.0, lambda: os.write(write_end, b"x"))
        backstop.start()
        (state / f"pid_{rank}").write_text(str(os.getpid()))
        os.read(read_end, 1)
        backstop.cancel()
    if mode == "fork_usr1":
        child = os.fork()
        if child == 0:
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
            os._exit(0)
        print(f"CHILD {os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])}", flush=True)
    if mode == "ignored_usr1":
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
    dist.destroy_process_group()
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
