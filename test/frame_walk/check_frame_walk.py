"""Run by test/test_frame_walk.py under each interpreter, with the `fw` module built for it.

Prints one JSON line: the interpreter version and, per call site (a plain call, a generator, a
coroutine, a comprehension, a lambda, a recursion deeper than 64 frames, another thread), what
`fw.walk_released()` returned: the number of frames that matched the public frame API (walked with
the GIL released), a negative number on a mismatch, or null where the walk is not built.
"""

import asyncio
import json
import sys
import threading

import fw


def plain():
    return fw.walk_released()


def gen():
    yield fw.walk_released()


async def coro():
    return fw.walk_released()


def deep(n):
    return plain() if n == 0 else deep(n - 1)


sites = {
    "plain": plain(),
    "generator": next(gen()),
    "coroutine": asyncio.run(coro()),
    "comprehension": [fw.walk_released() for _ in range(1)][0],
    "lambda": (lambda: fw.walk_released())(),
    "deep": deep(80),
}
out = []
th = threading.Thread(target=lambda: out.append(plain()))
th.start()
th.join()
sites["thread"] = out[0]
print(json.dumps({"version": list(sys.version_info[:2]), "agrees": fw.agrees(), "sites": sites}))
