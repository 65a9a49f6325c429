"""Why a rank leaves the job: the uncaught exception that ends its program.

The hook records the exception's type, message, innermost user frame and a short traceback in native
state (backend/ExitNote.hpp) before the interpreter exits; at exit, the native side writes the rank's
dump with it, opening a job-wide incident, so its peers' dumps and its own say who left and why.
The user's ``sys.excepthook`` (and anything chained before it) still runs, after the note is taken.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import time
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass

TRACEBACK_FRAMES = 12  # the innermost ones: where it failed, and the few calls that led there
TRACEBACK_TEXT_MAX = 8000  # the Python-format traceback an error file for torchrun carries, innermost part kept

_Hook = Callable[[type[BaseException], BaseException, types.TracebackType | None], object]
_previous: _Hook | None = None


@dataclass(frozen=True)
class ExitNote:
    type: str
    message: str
    frame: str
    traceback: str


def _library_dirs() -> tuple[str, ...]:
    """Folders whose frames are not the user's: the standard library, installed packages, torch, frnccl."""
    dirs = {sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs.add(os.path.dirname(os.path.abspath(__file__)))
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        dirs.add(os.path.dirname(os.path.abspath(torch.__file__)))
    return tuple(os.path.join(d, "") for d in sorted(dirs) if d)


def _text(value: object) -> str:
    """str() that never raises and never yields what native code cannot take (lone surrogates)."""
    try:
        text = str(value)
    except Exception as exc:  # a broken __str__ must not hide the exception itself
        text = f"<message unavailable: {type(exc).__name__}>"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def note_of(exc: BaseException) -> ExitNote:
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ in ("builtins", "__main__") else f"{kind.__module__}.{kind.__qualname__}"
    frames = traceback.extract_tb(exc.__traceback__)
    libs = _library_dirs()
    user = next((f for f in reversed(frames) if not os.path.abspath(f.filename).startswith(libs)),
                frames[-1] if frames else None)
    where = f"{user.filename}:{user.lineno} in {user.name}" if user is not None else ""
    lines = [f"{f.filename}:{f.lineno} in {f.name}" for f in frames[-TRACEBACK_FRAMES:]]
    if len(frames) > TRACEBACK_FRAMES:
        lines.insert(0, f"... {len(frames) - TRACEBACK_FRAMES} outer frames")
    return ExitNote(_text(name), _text(exc), _text(where), _text("\n".join(lines)))


@dataclass(frozen=True)
class _Recorded:
    note: ExitNote
    when_s: float  # time.time() as it reached the top of the program
    text: str  # Python's own traceback text
    victim: bool  # raised by a communication error: another rank's failure, not this rank's own
    exc: BaseException  # the exception itself: at exit, only the one that ended the program counts


_recorded: _Recorded | None = None
_install_pid: int | None = None  # a forked child inherits the hook and the note, but is not the rank


def record(exc: BaseException) -> bool:
    """Hands the note to native state; KeyboardInterrupt and SystemExit are the user's choice, not a fault.
    True when noted natively: the exception is this rank's own reason to leave."""
    global _recorded
    if not isinstance(exc, Exception) or hasattr(sys, "ps1") or sys.flags.interactive:
        return False  # an interactive session goes on after an uncaught exception
    if _not_own_fault(exc) or os.getpid() != _install_pid:
        return False
    from ._native import native

    n = note_of(exc)
    text = _text("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    victim = _from_communication(exc)
    _recorded = _Recorded(n, time.time(), text[-TRACEBACK_TEXT_MAX:], victim, exc)
    return not victim and bool(native().note_exit(n.type, n.message, n.frame, n.traceback))


def forget() -> None:
    """A new life of the process begins (an in-process restart): what the last one noted is not why it leaves."""
    global _recorded
    _recorded = None


def note_in_flight() -> bool:
    """Called natively as destroy_process_group tears down the last frnccl group: the exception this thread
    is propagating, if any (the teardown runs in a `finally:` or `except:`, as torchtitan's main does). Noted
    now, because once it reaches sys.excepthook no group is left to open the incident that says why this rank
    left. An exception that is then caught costs only that incident: the next group's life forgets the note."""
    try:
        exc = sys.exc_info()[1]
        return exc is not None and record(exc)
    except Exception:  # the teardown goes on, whatever noting met
        return False


# torch's Gloo monitored_barrier reports a peer that did not arrive: a detection of another rank.
# Its text, as ProcessGroupGloo throws it (after c10's "[FILE:LINE] " where torch adds one).
_MONITORED_BARRIER = re.compile(r"\A(?:\[[^\]\n]{0,300}\] )?Rank \d+ failed to pass monitoredBarrier in \d+ ms")


def _not_own_fault(exc: BaseException) -> bool:
    """Exceptions that say a rank is being stopped or that another rank failed: torch elastic's
    SignalException (its SIGTERM turned into an exception: the launcher stops this rank) and monitored_barrier's
    report of a rank that did not arrive. And control flow, not failures: an iterator that ran out, a test
    that skips (unittest's SkipTest)."""
    api = sys.modules.get("torch.distributed.elastic.multiprocessing.api")
    signal_exc = getattr(api, "SignalException", None)
    if isinstance(signal_exc, type) and isinstance(exc, signal_exc):
        return True
    skip = getattr(sys.modules.get("unittest"), "SkipTest", None)
    if isinstance(exc, (StopIteration, StopAsyncIteration)) or (isinstance(skip, type) and isinstance(exc, skip)):
        return True
    return isinstance(exc, RuntimeError) and _MONITORED_BARRIER.search(_text(exc)) is not None


def _from_communication(exc: BaseException) -> bool:
    """An error of torch.distributed itself (a collective that failed or timed out, the store), or one raised
    while handling it: the consequence of a failure the incident of that failure already explains, not a
    reason of this rank's own to leave."""
    import torch.distributed as dist

    comm = getattr(dist, "DistError", None)
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if comm is not None and isinstance(e, comm):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def after_exit() -> None:
    """Once the native exit hook has written this rank's part: tell torchrun's summary (its error file). A rank
    that leaves with no uncaught exception after a failure (a script that catches the error and calls
    sys.exit(1)) tells it too (_elastic_error.after_incident)."""
    from . import _elastic_error
    from ._native import native

    got = _recorded
    if os.getpid() != _install_pid:
        return
    if got is None:
        _elastic_error.after_incident()
        return
    n = got.note
    first, _, more = n.message.partition("\n")
    said = f"{n.type}: {first}{' ...' if more else ''}" + (f" at {n.frame}" if n.frame else "")
    lines = [f"frnccl: {_elastic_error.who()} left the job with {said}"]
    try:
        folder = native().exit_incident()
        incident, verdict = native().incident_verdict()
    except (UnicodeError, RuntimeError):
        folder, incident, verdict = "", "", ""
    try:
        recent, _, _, named, named_stamp_s, _ = native().incident_record()
    except (UnicodeError, RuntimeError):
        recent, named, named_stamp_s = "", [], 0
    if not (recent and recent == incident and folder.endswith("/" + incident)):
        named = []  # another incident's verdict names ranks of that one
    if verdict and incident and folder.endswith("/" + incident):
        lines.insert(0, verdict)  # the job's verdict first: what torchrun's summary shows on top
    if folder:
        lines.append(f"frnccl: its dump and the other ranks' are in {folder}: frnccl analyze {folder}")
    # torchrun's root cause is the file with the smallest whole-second timestamp: a victim's comes after any
    # raiser's or culprit's of the same second (and after its own time of writing), so it never wins a tie,
    # unless the verdict names this rank (its error follows from its own fault: a mismatched op it issued).
    when = max(int(got.when_s), int(time.time())) + 1 if got.victim else int(got.when_s)
    if _elastic_error.rank() in named and named_stamp_s > 0:
        when = min(when, named_stamp_s)
    _elastic_error.write(lines, f"{n.type}: {n.message}", got.text, when)


def _hook(kind: type[BaseException], exc: BaseException, tb: types.TracebackType | None) -> object:
    try:
        record(exc)
    except Exception:  # noting must never keep the user's hook, or Python's report, from running
        pass
    return (_previous or sys.__excepthook__)(kind, exc, tb)


def install() -> None:
    """Chains the hook in front of the one in place (once per process)."""
    global _previous, _install_pid
    _install_pid = os.getpid()
    if sys.excepthook is _hook:
        return
    _previous = sys.excepthook
    sys.excepthook = _hook


def _ending_exception() -> BaseException | None:
    """The exception that ended the program: Python sets sys.last_exc (3.12+) or sys.last_value for an
    uncaught one before any hook runs, and never for a library's own call of sys.excepthook."""
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


def confirm_at_exit() -> None:
    """At exit, before the native side acts on the note: a note whose exception did not end the program (a
    library called sys.excepthook on a healthy run) is forgotten, natively too."""
    global _recorded
    got = _recorded
    if got is None or _ending_exception() is got.exc:
        return
    _recorded = None
    if os.getpid() != _install_pid:
        return  # a forked child's note is the parent's; the native state it holds is a copy it does not use
    from ._native import native

    native().clear_exit_note()


def note_if_missed() -> None:
    """At exit: a hook installed after ours replaced it without chaining, but Python keeps the exception
    that ended the program in sys.last_value (set before any hook runs)."""
    exc = _ending_exception()
    if exc is None or (_recorded is not None and _recorded.exc is exc):
        return
    try:
        record(exc)
    except Exception:
        pass
