"""torchrun's failure summary ("Root Cause (first observed failure)") shows what a worker's error file says:
TORCHELASTIC_ERROR_FILE, in the format torch elastic's ErrorHandler writes, the failure with the earliest
timestamp being the root cause. A rank that leaves with an uncaught exception gets one from frnccl, saying
why it left and where the incident's dumps are. A file there already is @record's (written as the exception
passed its wrapper): it is kept, with frnccl's lines put in front of its traceback and frnccl's timestamp
(below). A rank that raised frnccl's error of a failure and leaves in any other way within a minute of that
failure's verdict (it caught the error and called sys.exit) gets one saying the verdict, unless a file is
there already. A process that took part in no failure writes none; torchrun reads the file only of a
process that failed.

The timestamps make the root cause a rank the verdict names, whatever the timing: such a rank's file carries
the second before it took part in the incident (before any victim raised, as they raise with the verdict), every
other rank's a second past its own exit. A rank the verdict names that torchrun stops writes its file on
SIGTERM (backend/Runtime.cpp, reportStopToElastic) by the same rule.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import tempfile
import time
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


def _replace(path: str, data: dict[str, Any], exclusive: bool = False) -> None:
    """Whole or not at all: the agent may read it as soon as the process is gone. `exclusive`: linked into
    place, never replacing a file that got there meanwhile (the SIGTERM handler's)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".frnccl-error-", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        if not exclusive:
            os.replace(tmp, path)
            return
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        os.unlink(tmp)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def rank() -> int:
    """This process's rank: its group's, else $RANK; -1 if neither tells."""
    import torch.distributed as dist

    try:
        if dist.is_initialized():
            return dist.get_rank()
    except Exception:  # a group already torn down, or a torch that cannot tell
        pass
    raw = os.environ.get("RANK", "")
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 10 else -1


def who() -> str:
    r = rank()
    return f"rank {r if r >= 0 else '?'} (host {socket.gethostname()}, pid {os.getpid()})"


def after_incident() -> None:
    """At exit with no uncaught exception: if this process took part in a failure whose verdict came within the
    last minute, a new error file says the verdict (an existing one is left as it is)."""
    from ._native import native

    if not os.environ.get(ENV):
        return
    try:
        incident, folder, verdict, named, named_stamp_s, raised = native().incident_record()
    except (UnicodeError, RuntimeError):
        return
    if not incident or not raised:
        return  # not this failure's: this process raised no error of it
    mine = rank() in named
    lines = [verdict, f"frnccl: {who()} left the job after incident {incident}" + (", whose verdict names it" if mine else "")]
    if folder:
        lines.append(f"frnccl: its dump and the other ranks' are in {folder}: frnccl analyze {folder}")
    when = named_stamp_s if mine and named_stamp_s > 0 else int(time.time()) + 1
    write(lines, f"{who()} left the job after incident {incident}", "", when, only_new=True)


def write(lines: list[str], message: str, callstack: str, when_s: int, only_new: bool = False) -> None:
    """`lines` (each starting with "frnccl: ") go first in the traceback torchrun shows; `message`,
    `callstack` and `when_s` (whole seconds: torchrun's root cause is the earliest) make a new file's; an
    existing one (@record's) gets the lines and `when_s`, so that its raise second cannot tie a culprit's.
    `only_new`: a file already there, or linked there meanwhile, is left alone."""
    path = os.environ.get(ENV)
    if not path:
        return
    if only_new and os.path.lexists(path):
        return
    head = "\n".join(lines)
    try:
        data = None if only_new else _read_existing(path)
        if data is None:
            data = {"message": {"message": message,
                                "extraInfo": {"py_callstack": f"{head}\n\n{callstack}" if callstack else head,
                                              "timestamp": str(int(when_s))}}}
        else:
            info = data["message"]["extraInfo"]
            if info["py_callstack"].startswith(head):
                return
            info["py_callstack"] = f"{head}\n\n{info['py_callstack']}"
            info["timestamp"] = str(int(when_s))
        _replace(path, data, exclusive=only_new)
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        _say(f"{ENV}={path[:200]!r}: cannot add why this rank left ({why[:200]}); torchrun's summary will not show it")
