"""torchrun's failure summary ("Root Cause (first observed failure)") shows what a worker's error file says:
TORCHELASTIC_ERROR_FILE, in the format torch elastic's ErrorHandler writes, the failure with the earliest
timestamp being the root cause. A rank that leaves with an uncaught exception gets one from frnccl, saying
why it left and where the incident's dumps are. A file there already is @record's (written as the exception
passed its wrapper): it is kept, with frnccl's lines put in front of its traceback. A healthy exit writes none.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from typing import Any

ENV = "TORCHELASTIC_ERROR_FILE"
MAX_EXISTING = 1 << 20  # @record's file holds one traceback: a larger one is not its, and is left alone


def _say(text: str) -> None:
    print(f"frnccl: {text}", file=sys.stderr, flush=True)


def _read_existing(path: str) -> dict[str, Any] | None:
    """@record's JSON if `path` holds it; None if there is no file. Raises ValueError for anything else."""
    try:
        # O_NONBLOCK: a FIFO put there must not hold the exit up waiting for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("not a regular file")
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_EXISTING + 1)
    if len(raw) > MAX_EXISTING:
        raise ValueError("larger than an error file of torch elastic's")
    data = json.loads(raw)
    info = data.get("message", {}).get("extraInfo") if isinstance(data, dict) and isinstance(data.get("message"), dict) else None
    if not isinstance(info, dict) or not isinstance(info.get("py_callstack"), str):
        raise ValueError("not in the format torch elastic's @record writes")
    return data


def _replace(path: str, data: dict[str, Any]) -> None:
    """Whole or not at all: the agent may read it as soon as the process is gone."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".frnccl-error-", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write(lines: list[str], message: str, callstack: str, when_s: int) -> None:
    """`lines` (each starting with "frnccl: ") go first in the traceback torchrun shows; `message`,
    `callstack` and `when_s` (whole seconds: torchrun's root cause is the earliest) make a new file's."""
    path = os.environ.get(ENV)
    if not path:
        return
    head = "\n".join(lines)
    try:
        data = _read_existing(path)
        if data is None:
            data = {"message": {"message": message,
                                "extraInfo": {"py_callstack": f"{head}\n\n{callstack}", "timestamp": str(int(when_s))}}}
        else:
            info = data["message"]["extraInfo"]
            if info["py_callstack"].startswith(head):
                return
            info["py_callstack"] = f"{head}\n\n{info['py_callstack']}"
        _replace(path, data)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        _say(f"{ENV}={path[:200]!r}: cannot add why this rank left ({why[:200]}); torchrun's summary will not show it")
