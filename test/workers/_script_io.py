"""Output and holding for the training-style scripts (enable_*.py): nothing here knows of any backend.

`out(key, value)` prints `OUT <rank> <key>=<value>`, one write per line; the test compares these lines
between runs. `hold()`, when HOLD_DIR is set, writes HOLD_DIR/pid_<rank> and waits for HOLD_DIR/stop (the
test's signal that it is done with the live job), up to HOLD_MAX_S, before the script tears down.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

HOLD_MAX_S = 120.0


def out(key: str, value: Any) -> None:
    os.write(1, f"OUT {os.environ.get('RANK', '?')} {key}={value}\n".encode())


def tensor_text(t: Any) -> str:
    return ",".join(f"{v:g}" for v in t.flatten().tolist())


def hold() -> None:
    folder = os.environ.get("HOLD_DIR")
    if not folder:
        return
    state = Path(folder)
    (state / f"pid_{os.environ['RANK']}.tmp").write_text(str(os.getpid()))
    (state / f"pid_{os.environ['RANK']}.tmp").rename(state / f"pid_{os.environ['RANK']}")
    end = time.monotonic() + HOLD_MAX_S
    while not (state / "stop").exists() and time.monotonic() < end:
        time.sleep(0.05)


def done() -> None:
    os.write(1, f"DONE_MONO {time.monotonic()}\n".encode())
