"""The verdict for programs: what restart scripts and in-process restart managers act on.

The rank that judges an incident writes the verdict as JSON (docs/dump-format.md, "Verdict") to
``<incident folder>/verdict.json`` and to ``FRNCCL_VERDICT_FILE`` when set; every rank learns it through
the store. ``read_verdict_file`` reads such a file, ``on_verdict`` hands each new one to a callback in the
process. Both check what they read as hostile (a file or store value anyone could have written): a value
that is not a verdict of this format is refused with one line naming what is wrong, never half-used.
"""

from __future__ import annotations

import json
import os
import atexit
import re
import stat
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .schema import VERDICT_SCHEMA, VERDICT_VERSION

MAX_VERDICT_BYTES = 64 * 1024  # a verdict is at most 8 KB (backend/VerdictFile.hpp); larger is not one
HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")
INCIDENT_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]{0,255}")  # a folder name: no separator, never "." or ".."
KINDS = frozenset({"left_with_exception", "not_joined", "p2p_unmatched", "left_early", "op_mismatch", "size_mismatch",
                   "dtype_mismatch", "missing_dump", "undecided"})


class VerdictError(ValueError):
    """A file or value that is not a verdict of this format."""


@dataclass(frozen=True)
class Culprit:
    rank: int
    host: str | None
    pid: int | None


@dataclass(frozen=True)
class Verdict:
    """One incident's verdict (the keys of scope ``verdict`` in dump_keys.def)."""

    incident_id: str
    incident_dir: str
    decided: bool
    kind: str
    culprit_ranks: tuple[int, ...]
    culprits: tuple[Culprit, ...]
    victim_ranks: tuple[int, ...]
    op: str
    pg: str
    pg_desc: str
    collective_seq_id: int | None
    p2p_seq_id: int | None
    undecided_reason: str
    line: str
    world_size: int
    ranks_wrote: int
    judged_by_rank: int
    seconds_to_verdict: float
    time_ns: int

    @property
    def culprit_hosts(self) -> tuple[str, ...]:
        """The hosts the culprits ran on, each once, in the verdict's order ('' hosts left out)."""
        return tuple(dict.fromkeys(c.host for c in self.culprits if c.host))


def _int(d: dict, key: str, nullable: bool = False) -> int | None:
    v = d.get(key)
    if v is None and nullable:
        return None
    if type(v) is not int or v < -1 or v >= 1 << 62:
        raise VerdictError(f"{key} is not a count or rank: {str(v)[:40]!r}")
    return v


def _str(d: dict, key: str, limit: int = 4096) -> str:
    v = d.get(key)
    if not isinstance(v, str) or len(v) > limit or not v.isprintable():
        raise VerdictError(f"{key} is not a printable string of at most {limit} characters")
    return v


def _ranks(d: dict, key: str, world: int) -> tuple[int, ...]:
    v = d.get(key)
    if (not isinstance(v, list) or not all(type(r) is int and 0 <= r < world for r in v)
            or len(set(v)) != len(v)):
        raise VerdictError(f"{key} is not a list of distinct ranks of a job of {world}")
    return tuple(v)


def parse_verdict(text: str | bytes) -> Verdict:
    """A verdict from its JSON text; VerdictError naming what is wrong otherwise."""
    if len(text) > MAX_VERDICT_BYTES:
        raise VerdictError(f"larger than a verdict ({len(text)} bytes)")
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise VerdictError(f"not JSON ({str(exc)[:80]})") from None
    if not isinstance(d, dict) or d.get("schema") != VERDICT_SCHEMA:
        raise VerdictError(f"not a verdict (no schema {VERDICT_SCHEMA!r})")
    version = d.get("version")
    if type(version) is not int or not 1 <= version <= VERDICT_VERSION:
        raise VerdictError(f"verdict version {str(version)[:20]!r}: this frnccl reads version {VERDICT_VERSION}")
    world = _int(d, "world_size") or 0
    if world <= 0:
        raise VerdictError("world_size is not a positive count")
    kind = _str(d, "kind", 64)
    decided = d.get("decided")
    if kind not in KINDS or not isinstance(decided, bool) or decided == (kind == "undecided"):
        raise VerdictError(f"kind {kind[:64]!r} with decided={decided!r} is not a verdict's")
    culprit_ranks = _ranks(d, "culprit_ranks", world)
    if decided and not culprit_ranks:
        raise VerdictError("a decided verdict names no rank")
    incident_id = _str(d, "incident_id", 256)
    if not INCIDENT_ID.fullmatch(incident_id):
        raise VerdictError("incident_id is not an incident folder's name")
    judged_by = _int(d, "judged_by_rank") or 0
    wrote = _int(d, "ranks_wrote") or 0
    if not 0 <= judged_by < world or not 0 <= wrote <= world:
        raise VerdictError(f"judged_by_rank or ranks_wrote is not of a job of {world}")
    raw_culprits = d.get("culprits")
    if not isinstance(raw_culprits, list) or not all(isinstance(c, dict) for c in raw_culprits):
        raise VerdictError("culprits is not a list of dicts")
    culprits = []
    for c in raw_culprits:
        rank = _int(c, "rank")
        host = c.get("host")
        # A restart script hands hosts to a scheduler's command line: only what a host name can be.
        if rank not in culprit_ranks or not (host is None or (isinstance(host, str) and HOST_NAME.fullmatch(host))):
            raise VerdictError("a culprit is not one of culprit_ranks, or its host is not a host name")
        culprits.append(Culprit(rank, host, _int(c, "pid", nullable=True)))
    seconds = d.get("seconds_to_verdict")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 <= seconds < 1e9:
        raise VerdictError("seconds_to_verdict is not a duration")
    return Verdict(
        incident_id=incident_id, incident_dir=_str(d, "incident_dir"), decided=decided, kind=kind,
        culprit_ranks=culprit_ranks, culprits=tuple(culprits), victim_ranks=_ranks(d, "victim_ranks", world),
        op=_str(d, "op", 64), pg=_str(d, "pg", 256), pg_desc=_str(d, "pg_desc", 256),
        collective_seq_id=_int(d, "collective_seq_id", nullable=True), p2p_seq_id=_int(d, "p2p_seq_id", nullable=True),
        undecided_reason=_str(d, "undecided_reason"), line=_str(d, "line"), world_size=world,
        ranks_wrote=wrote, judged_by_rank=judged_by,
        seconds_to_verdict=float(seconds), time_ns=_int(d, "time_ns") or 0)


def read_verdict_file(path: str | os.PathLike[str]) -> Verdict:
    """The verdict in a file (FRNCCL_VERDICT_FILE, or an incident's verdict.json). OSError if it cannot be
    read; VerdictError if it is not a verdict (a FIFO or device there is not: never waited on)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise VerdictError(f"{os.fspath(path)[:200]} is not a regular file")
        return parse_verdict(f.read(MAX_VERDICT_BYTES + 1))


# --------------------------------------------------------------------------- in-process callbacks

_callbacks: list[Callable[[Verdict], object]] = []
_lock = threading.Lock()
_thread: threading.Thread | None = None
_stopping = threading.Event()
POLL_MS = 1000  # how long one native wait lasts; the thread never holds the GIL while it waits
STOP_WAIT_S = 2.0  # at exit: the thread is woken at once, and is given this long to return


def on_verdict(callback: Callable[[Verdict], object]) -> None:
    """Call ``callback(verdict)`` for each failure's verdict that reaches this process from now on (every rank
    learns it through the store, within a second or so of the judging rank; of two that come within one wait,
    the later one). Called on a thread of frnccl's, in the order registered; an exception it raises is said in
    one line and the next callback still runs. A value that is not a verdict (a store client wrote something
    else) is said in one line, not passed on. The thread is stopped at exit, before the interpreter goes away.
    For in-process restart managers (torchft's Manager, nvidia-resiliency-ext): decide there, don't block."""
    global _thread
    if not callable(callback):
        raise TypeError(f"on_verdict needs a callable, got {type(callback).__name__}")
    with _lock:
        _callbacks.append(callback)
        if _thread is None or not _thread.is_alive():
            from ._native import native

            seen, _ = native().incident_verdict()  # a verdict that came before is not news
            _stopping.clear()
            _thread = threading.Thread(target=_deliver, args=(seen,), name="frnccl-verdict", daemon=True)
            _thread.start()


def _stop_at_exit() -> None:
    # Before finalization: a daemon thread that wakes from the native wait then would be torn down while it
    # takes the GIL back, which can abort the process.
    thread = _thread
    if thread is None or not thread.is_alive():
        return
    from ._native import native

    _stopping.set()
    native().wake_verdict_waiters()
    thread.join(STOP_WAIT_S)


def _after_fork_in_child() -> None:
    global _thread, _lock
    _thread, _lock = None, threading.Lock()  # the thread is not in the child; the lock may have been held
    _stopping.clear()


atexit.register(_stop_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)


def _say(text: str) -> None:
    print(f"frnccl: {text}", file=sys.stderr, flush=True)


def _deliver(seen: str) -> None:
    try:
        from ._native import native

        while not _stopping.is_set():
            incident, raw = native().next_verdict(seen, POLL_MS)
            if not incident or _stopping.is_set():
                continue
            seen = incident
            if raw:
                _hand_on(incident, bytes(raw))
    except BaseException as exc:  # the thread ends; the job goes on
        _say(f"on_verdict's thread stopped: {type(exc).__name__}: {str(exc)[:200]}")


def _hand_on(incident: str, raw: bytes) -> None:
    try:
        verdict = parse_verdict(raw)
    except VerdictError as exc:
        _say(f"the verdict of incident {incident[:200]!r} is not one this frnccl reads ({exc}); not passed to on_verdict")
        return
    with _lock:
        callbacks = list(_callbacks)
    for cb in callbacks:
        try:
            cb(verdict)
        except BaseException as exc:  # one callback's failure must not keep the next from its verdict
            _say(f"on_verdict callback {getattr(cb, '__qualname__', cb)!s:.120} raised {type(exc).__name__}: "
                 f"{str(exc)[:200]}")
