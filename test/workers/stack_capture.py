"""Caller stacks recorded by frnccl, compared frame by frame with traceback.extract_stack().

    stack_capture.py

Each case issues an all_reduce on the same source line as its extract_stack() call, so the
recorded stack must hold exactly the expected frames (names, files, lines) outside torch's
own. Cases: a plain call, a generator, a coroutine, a comprehension, a lambda, a thread,
a recursion deeper than the 64 frames frnccl keeps, and a loop that repeats one call site and
alternates with others (a thread shares the stack of its previous op when the frames are the
same, so an op that differs from the one before it only in an outer frame must not get it).
Every case runs twice: first with the process's chosen capture (the GIL-free walk of the
interpreter's frames where supported), then through the public frame API. Prints one RESULT line.
"""

from __future__ import annotations

import asyncio
import json
import threading
import traceback

import torch
import torch.distributed as dist

import fr_backend
from _worker import RANK, init
from fr_backend._native import native

KEPT = 64  # frames frnccl keeps per stack
t = torch.ones(4)
expected: list[list[tuple[str, str, int]]] = []  # per op, innermost first


def note(stack: traceback.StackSummary) -> None:
    expected.append([(f.name, f.filename, f.lineno) for f in reversed(stack)])


def plain_call() -> None:
    note(traceback.extract_stack()); dist.all_reduce(t)  # noqa: E702


def in_generator():
    note(traceback.extract_stack()); dist.all_reduce(t)  # noqa: E702
    yield 1


async def in_coroutine() -> None:
    note(traceback.extract_stack()); dist.all_reduce(t)  # noqa: E702


def in_comprehension() -> None:
    [(note(traceback.extract_stack()), dist.all_reduce(t)) for _ in range(1)]


def in_lambda() -> None:
    (lambda: (note(traceback.extract_stack()), dist.all_reduce(t)))()


def in_thread() -> None:
    th = threading.Thread(target=plain_call, name="issuer")
    th.start()
    th.join()


def deep(n: int) -> None:
    if n == 0:
        plain_call()
        return
    deep(n - 1)


def repeats_and_alternations() -> None:
    for _ in range(2):
        plain_call()
        plain_call()  # the same inner frames as the line above, another line outside
        in_lambda()


CASES = [plain_call, lambda: list(in_generator()), lambda: asyncio.run(in_coroutine()), in_comprehension, in_lambda,
         in_thread, lambda: deep(KEPT + 10), repeats_and_alternations]


def main() -> None:
    init("frnccl")
    C = native()
    modes = [C.stack_capture()]
    for case in CASES:
        case()
    C._use_public_frame_api()
    modes.append(C.stack_capture())
    for case in CASES:
        case()
    entries = [e for e in fr_backend.trace_entries()["entries"] if e["profiling_name"] == "gloo:all_reduce"]
    mismatches = []
    for i, (entry, want) in enumerate(zip(entries, expected)):
        got = [(f["name"], f["filename"], f["line"]) for f in entry["frames"]]
        ours = [f for f in got if "/torch/" not in f[1]]
        torch_frames = got[: len(got) - len(ours)]
        # Outside torch's own frames (innermost), the recorded stack is the caller's, cut at KEPT frames.
        if ours != want[: len(ours)] or len(got) != min(KEPT, len(torch_frames) + len(want)) or not torch_frames:
            mismatches.append({"op": i, "want": want[:8], "got": got[:8], "len_got": len(got), "len_want": len(want)})
    print("RESULT " + json.dumps({"rank": RANK, "modes": modes, "ops": len(entries), "expected": len(expected),
                                  "mismatches": mismatches[:3], "n_mismatches": len(mismatches)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
