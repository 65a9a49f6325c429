"""A rank leaves the job with an uncaught exception, as one that runs out of GPU memory does.

    exit_exception.py STEPS RAISER MODE

Every rank runs STEPS training steps: forward, then an all_reduce of its gradients. At step STEPS rank
RAISER raises RuntimeError("CUDA out of memory ...") in forward (simulated on CPU); the others go on into
that step's all_reduce, wait for it, and fail there, uncaught too. RAISER -1: nobody fails (a healthy
job: each rank raises and catches an exception of its own, which must leave no trace); the group is
left to the exit hook, as many scripts do.

MODE: plain | hook_before (the user's sys.excepthook, set before init_process_group) | hook_after (set
after it) | record (main wrapped in torch elastic's @record; its error file ERROR_FILE_BASE.<rank> where
torchrun gives none) | report (a healthy job whose library reports a handled exception by calling
sys.excepthook itself; TORCHELASTIC_ERROR_FILE is ERROR_FILE_BASE.<rank>). MODE+finally: main tears the
group down in a `finally:` (destroy_process_group), as torchtitan's does, while the exception propagates;
MODE+in_except: after its steps, main tears the group down inside `except StopIteration:` (control flow).
"""

from __future__ import annotations

import os
import sys
import time
import types

import torch
import torch.distributed as dist

from _incident import warmed_up_group

STEPS, RAISER, MODE = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
MODE, _, TEARDOWN = MODE.partition("+")
RANK = int(os.environ["RANK"])
if MODE in ("record", "report") and "ERROR_FILE_BASE" in os.environ:  # not under torchrun, which gives each worker its own
    os.environ["TORCHELASTIC_ERROR_FILE"] = f"{os.environ['ERROR_FILE_BASE']}.{RANK}"


def user_hook(kind: type[BaseException], exc: BaseException, tb: types.TracebackType | None) -> None:
    print(f"USER_HOOK {kind.__name__}: {str(exc).splitlines()[0]}", flush=True)


def forward(step: int, x: torch.Tensor) -> torch.Tensor:
    if RANK == RAISER and step == STEPS:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\n(simulated on CPU)")
    return x * 1.0


def train() -> None:
    if MODE == "hook_before":
        sys.excepthook = user_hook
    _, t = warmed_up_group(1)
    if MODE == "hook_after":
        sys.excepthook = user_hook
    for step in range(1, STEPS + 1):
        out = forward(step, t)
        dist.all_reduce(out)
        print(f"STEP {step}", flush=True)
    if RAISER < 0:
        try:
            raise ValueError("handled by the script")
        except ValueError as exc:
            if MODE == "report":
                sys.excepthook(type(exc), exc, exc.__traceback__)
    print(f"DONE_MONO {time.monotonic()}", flush=True)


if MODE == "record":
    from torch.distributed.elastic.multiprocessing.errors import record

    train = record(train)

if __name__ == "__main__":
    if TEARDOWN == "finally":
        try:
            train()
        finally:
            dist.destroy_process_group()
    elif TEARDOWN == "in_except":
        train()
        try:
            next(iter(()))  # the data ran out
        except StopIteration:
            dist.destroy_process_group()
    else:
        train()
