"""A progress bar on stderr, only when stderr is a terminal and the input is large."""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

MIN_FILES = 32


def make_progress(total_hint: int | None = None, stream: TextIO | None = None,
                  label: str = "loading dumps") -> Callable[[int, int], None] | None:
    s = stream or sys.stderr
    try:
        tty = s.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty:
        return None
    last = [0.0]

    def update(done: int, total: int) -> None:
        if total < MIN_FILES:
            return
        now = time.monotonic()
        if done != total and now - last[0] < 0.1:
            return
        last[0] = now
        width = 30
        fill = width * done // max(total, 1)
        s.write(f"\r{label} [{'#' * fill}{'.' * (width - fill)}] {done}/{total}")
        if done == total:
            s.write("\r" + " " * (len(label) + width + 24) + "\r")
        s.flush()

    return update
