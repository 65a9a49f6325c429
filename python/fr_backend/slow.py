"""Live slow-rank detection: the rank that makes the job slow, named in the job's log while it runs.

Each rank's thread (daemon, SIGTERM blocked, never on the op path) wakes at the end of every window of
FRNCCL_SLOW_WINDOW_SEC wall-clock seconds, reads from its own recorder the waits of the collectives that
completed in it, and appends one line (quantiles per group, `slow_judge.GroupReport`) to the window's key
in the root store: one request per rank and window, and none from a rank that ran no collective in it.
Global rank 0 reads the window's key once, judges it (`slow_judge.SlowJudge`), says what it found in one
line per rank found slow or well again, posts the latest lateness for `frnccl status` (STATE_KEY), and
deletes the key. Ranks stop posting while rank 0's acknowledgement (ACK_KEY, read every ACK_EVERY windows)
is older than that, so that a job whose rank 0 no longer judges leaves nothing growing in the store.
Everything read from the store is checked: a line that does not parse is left out.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from .config import ConfigError, SlowSettings, slow_settings
from .slow_judge import QUANTILES, GroupReport, Lateness, RankReport, SlowJudge, finding_line

KEY_PREFIX = "frnccl/slow/"
STATE_KEY = KEY_PREFIX + "state"
ACK_KEY = KEY_PREFIX + "ack"
ACK_EVERY = 4  # windows
LIFE_CHECK_S = 0.5  # how soon the detector lets go of the store once the job tore its groups down
MAX_LINE_BYTES = 8192
MAX_GROUPS = 16
MAX_WAITS_PER_GROUP = 4096
SCANNED_ENTRIES = 16384
MAX_TEXT = 120


def _say(line: str) -> None:
    print(f"frnccl: {line}", file=sys.stderr, flush=True)


def window_key(window: int) -> str:
    return f"{KEY_PREFIX}w{window}"


def quantiles(values: list[float]) -> tuple[float, ...]:
    ordered = sorted(values)
    last = len(ordered) - 1
    return tuple(ordered[min(last, int(q * len(ordered)))] for q in QUANTILES)


def _text(value: Any) -> str:
    text = str(value)[:MAX_TEXT]
    return "".join(c if c.isprintable() else "?" for c in text)


def _bounded(value: Any, low: int, high: int) -> int:
    n = int(value)
    if not low <= n <= high:
        raise ValueError(f"{n} out of [{low}, {high}]")
    return n


def _share(value: Any) -> float:
    x = float(value)
    if not math.isfinite(x) or not 0 <= x <= 1e3:
        raise ValueError(f"{x} is not a share")
    return x


def parse_report(line: bytes, world_size: int = 1 << 30) -> RankReport | None:
    """One rank's line from the store, or None where it is not one (anything may be there): every number is
    bounded by what a rank of a job of `world_size` can report."""
    if len(line) > MAX_LINE_BYTES:
        return None
    try:
        d = json.loads(line)
        groups = []
        for g in d["g"][:MAX_GROUPS]:
            qs = tuple(float(x) for x in g["q"])
            if len(qs) != len(QUANTILES) or not all(math.isfinite(x) and 0 <= x < 1e6 for x in qs):
                return None
            size = _bounded(g["s"], 1, world_size)
            groups.append(GroupReport(_text(g["n"]), _text(g["d"]), size, _bounded(g["r"], 0, size - 1), _text(g["o"]),
                                      _bounded(g["c"], 0, MAX_WAITS_PER_GROUP), qs, _share(g["b"])))
        return RankReport(_bounded(d["rank"], 0, world_size - 1), _text(d["host"]), _bounded(d["pid"], 0, 1 << 31),
                          _share(d["ws"]), tuple(groups), bool(d["p2p"]))
    except (ValueError, KeyError, TypeError, IndexError, OverflowError, AttributeError, RecursionError):
        return None


P2P_KINDS = ("send", "recv", "coalesced")  # a coalesced block is mostly batch_isend_irecv


def union_s(intervals: list[tuple[int, int]]) -> float:
    """Seconds covered by the (start, end) intervals (ns): the time a rank spent waiting in them, counting
    overlapping ops (DDP's bucket all_reduces, FSDP's prefetched all_gathers) once."""
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / 1e9


def own_report(rank: int, groups: list[dict[str, Any]], ops_before: dict[str, dict[str, int]],
               start_ns: int, end_ns: int) -> tuple[RankReport, dict[str, dict[str, int]]]:
    """This rank's report for the window [start_ns, end_ns) from `collective_waits`'s groups (only the ops that
    completed inside it); also the op counts to diff the next window with."""
    window_s = (end_ns - start_ns) / 1e9
    out = []
    everything: list[tuple[int, int]] = []
    ops_now: dict[str, dict[str, int]] = {}
    ran_p2p = False
    for g in groups:
        name = str(g["name"])
        ops_now[name] = dict(g["ops"])
        before = ops_before.get(name, {})
        ran = {op: n - before.get(op, 0) for op, n in g["ops"].items() if n > before.get(op, 0)}
        ran_p2p = ran_p2p or any(op in P2P_KINDS for op in ran)
        spans = [(max(t, start_ns), t + w) for t, w in zip(g["enqueued_ns"], g["waits_ns"]) if t + w <= end_ns]
        if not spans:
            continue
        everything += spans
        waits = [w / 1e9 for t, w in zip(g["enqueued_ns"], g["waits_ns"]) if t + w <= end_ns]
        op = max((k for k in ran if k not in P2P_KINDS), key=lambda k: ran[k], default="collective")
        out.append(GroupReport(name, str(g["desc"]), int(g["size"]), int(g["rank_in_group"]), op, len(waits),
                               quantiles(waits), union_s(spans) / window_s))
    report = RankReport(rank, socket.gethostname(), os.getpid(), union_s(everything) / window_s,
                        tuple(out[:MAX_GROUPS]), ran_p2p)
    return report, ops_now


def report_line(report: RankReport) -> bytes:
    d = {"rank": report.rank, "host": report.host, "pid": report.pid, "ws": round(report.wait_share, 4),
         "p2p": report.ran_p2p,
         "g": [{"n": g.name, "d": g.desc, "s": g.size, "r": g.rank_in_group, "o": g.op, "c": g.ops,
                "b": round(g.busy_share, 4), "q": [round(q, 6) for q in g.quantiles_s]} for g in report.groups]}
    return (json.dumps(d, separators=(",", ":")) + "\n").encode()


STATE_GROUPS = 64  # the most costly groups only: a job of 16,384 ranks in tp groups of 8 has 2,048 of them


def state_value(judge: SlowJudge, window: int, window_s: float) -> bytes:
    """What `frnccl status` shows: the slow ranks, and the most costly groups' latest lateness, most costly
    first; with the window's end (Unix time), so that a state no longer refreshed shows its age."""
    costliest = sorted(judge.last.items(), key=lambda kv: -max((x.share for x in kv[1]), default=0.0))[:STATE_GROUPS]
    groups = {name: [{"rank": x.rank, "late_ms": round(x.late_s * 1e3, 2), "share": round(x.share, 4),
                      "op": x.op, "desc": x.desc} for x in late] for name, late in costliest}
    return json.dumps({"window": window, "window_s": window_s, "ended": (window + 1) * window_s,
                       "slow": judge.slow_ranks(), "groups": groups}, separators=(",", ":")).encode()


@dataclass
class Identity:
    rank: int
    world_size: int


class Detector:
    """The per-process thread, and, on rank 0, the judge. It posts through the job's own store connection
    (the root store), not a clone of it: a clone is one more connection per rank for the store host to
    accept, and torch's store server looks each one's peer up in DNS on its only thread, which at startup
    makes every rank wait (docs/benchmarks.md, "Job startup"); its client serializes the two threads' calls.
    It lets go of the store within LIFE_CHECK_S of the job tearing its groups down, so that the store's
    server (in rank 0, or the launcher) goes when the job drops it."""

    def __init__(self, settings: SlowSettings, identity: Identity, store: Any) -> None:
        self.settings = settings
        self.identity = identity
        self.root: Any = store  # until the thread takes it (_connect)
        self.store: Any = None
        self.stop = threading.Event()
        self.said: set[str] = set()
        self.judge = SlowJudge(min_share=settings.min_share)
        self.ops_before: dict[str, dict[str, int]] = {}
        self.life = -1
        self.acked = True
        self.first_window = -1
        self.last_judged = -1
        self.latest: dict[str, list[Lateness]] = {}  # rank 0: each group's lateness in the last judged window
        self.own: dict[str, tuple[str, float]] = {}  # each rank: its median wait per group in its last window (as computed for the judge)
        self.lock = threading.Lock()  # guards root and identity, which a new life replaces
        self.thread = threading.Thread(target=self._run, name="frnccl-slow", daemon=True)

    def say_once(self, key: str, line: str) -> None:
        if key not in self.said:
            self.said.add(key)
            _say(f"slow-rank detection: {line}")

    def new_life(self, store: Any, identity: Identity) -> None:
        with self.lock:
            self.root, self.identity = store, identity
            self.judge = SlowJudge(min_share=self.settings.min_share)
            self.latest, self.last_judged, self.first_window, self.acked = {}, -1, -1, True
            self.own = {}

    def _connect(self) -> bool:
        with self.lock:
            root, self.root = self.root, None
        if root is not None:
            self.store = root
        return self.store is not None

    def _wait_until(self, when_ns: int, C: Any) -> bool:
        """Sleeps until `when_ns` (wall), letting go of the store as soon as the life ends; False when stopped."""
        while True:
            left = (when_ns - time.time_ns()) / 1e9
            if left <= 0:
                return True
            if self.stop.wait(min(left, LIFE_CHECK_S)):
                return False
            if (self.store is not None or self.root is not None) and not C.life_alive():
                self._let_go(C)

    def _let_go(self, C: Any) -> None:
        """The job tore its groups down: its store may go. (A store is handed over once its life's first group
        attached, so a life that is not alive has ended.) Asked again under the lock: a new life may have
        handed over its store since."""
        with self.lock:
            if not C.life_alive():
                self.store = self.root = None
                self.own = {}  # its groups are gone: no figure of theirs is served any longer

    def _run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        from ._native import native

        C = native()
        C.date_completions(True)
        window_ns = int(self.settings.window_s * 1e9)
        window = time.time_ns() // window_ns + 1  # the first whole window
        while self._wait_until(window * window_ns, C):
            try:
                if not C.life_alive():
                    self._let_go(C)
                elif self._connect():
                    self._post(C, window - 1, window_ns)
                    if self.identity.rank == 0:
                        if self.stop.wait(min(2.0, self.settings.window_s / 4)):
                            return
                        self._judge(window - 1)
            except Exception as e:  # noqa: BLE001 - detection must never end the job
                self.say_once(f"{type(e).__name__}", f"a window was skipped ({type(e).__name__}: {str(e)[:160]}); it goes on")
            window = max(window + 1, time.time_ns() // window_ns + 1)

    def _post(self, C: Any, window: int, window_ns: int) -> None:
        start = window * window_ns
        life, groups = C.collective_waits(start, SCANNED_ENTRIES, MAX_WAITS_PER_GROUP)
        if life != self.life:
            self.life, self.ops_before = life, {}
        report, self.ops_before = own_report(self.identity.rank, groups, self.ops_before, start, start + window_ns)
        # What this rank tells the judge, kept for its own metrics: every rank's lateness is then one PromQL
        # query away on every host, with no figure of another rank's crossing the store.
        self.own = {g.name: (g.desc, g.median_s) for g in report.groups}
        if not report.groups:
            return  # no collective completed in the window: nothing to say, no request
        if (window % ACK_EVERY == 0 or not self.acked) and self.identity.rank != 0:
            self.acked = self._ack_fresh(window)
        if self.acked:
            self.store.append(window_key(window), report_line(report))

    def _ack_fresh(self, window: int) -> bool:
        """Whether rank 0 judged a recent window (or may not have had the time to yet)."""
        if self.first_window < 0:
            self.first_window = window
        if self.store.check([ACK_KEY]):
            try:
                acked = int(self.store.get(ACK_KEY))
                if 0 <= window - acked <= 2 * ACK_EVERY:  # an ack from the future is no ack
                    return True
            except ValueError:
                pass
        return window - self.first_window <= 2 * ACK_EVERY

    def _judge(self, window: int) -> None:
        self.store.set(ACK_KEY, str(window))
        # Windows since the last judged one that were not judged (this thread fell behind, or a store call
        # failed), and the one before it, which a rank may have re-made after it was read: deleted, so that
        # nothing grows in the store (at most 8 a window).
        first = max(self.last_judged - 1, window - 8) if self.last_judged >= 0 else window - 2
        stale = [window_key(w) for w in range(first, window) if w != self.last_judged]
        self.last_judged = window
        key = window_key(window)
        if self.store.check([key]):
            raw = self.store.get(key)
            self.store.delete_key(key)
        else:
            raw = b""
        for k in stale:
            self.store.delete_key(k)
        reports: dict[int, RankReport] = {}
        world = max(self.identity.world_size, 1)
        for line in raw.split(b"\n"):
            report = parse_report(line, world) if line else None
            if report is not None:
                reports[report.rank] = report  # one per rank: a later line replaces an earlier one
        for finding in self.judge.judge(list(reports.values()), self.settings.window_s, window):
            _say(finding_line(finding))
        self.latest = {name: list(late) for name, late in self.judge.last.items()}
        self.store.set(STATE_KEY, state_value(self.judge, window, self.settings.window_s))

    def close(self) -> None:
        """At exit: the thread is stopped before Python finalizes (a daemon thread that comes back from a call
        that let go of the GIL during finalization ends the process with SIGABRT). Bounded: a thread inside a
        store call that does not answer is left to the process's end."""
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=1.0)


_detector: Detector | None = None
_refused = False  # a bad setting: said once per process, not once per group
_lock = threading.Lock()


def _close_at_exit() -> None:
    detector = _detector
    if detector is not None:
        detector.close()


def note_group(store: Any, rank: int, world_size: int, new_life: bool, env: Any = None) -> None:
    """Called as a frnccl group is created: starts the detector once per process; a new life (the first group
    after a teardown: torchft, in-process restarts) gives it this life's rank, world size and store. Never
    raises."""
    global _detector, _refused
    try:
        with _lock:
            while hasattr(store, "underlying_store") and store.underlying_store is not None:
                store = store.underlying_store  # keys of one job, whatever group made the store
            if _detector is not None:
                if new_life:
                    _detector.new_life(store, Identity(rank, world_size))
                return
            if _refused:
                return
            settings = slow_settings(os.environ if env is None else env)
            if not settings.enabled or world_size < 2:
                return
            _detector = Detector(settings, Identity(rank, world_size), store)
            _detector.thread.start()
            import atexit

            atexit.register(_close_at_exit)
    except ConfigError as e:
        _refused = True
        _say(f"slow-rank detection: {e}; it is off; the job goes on")
    except Exception as e:  # noqa: BLE001
        _refused = True
        _say(f"slow-rank detection: not started ({type(e).__name__}: {str(e)[:160]}); the job goes on")


def latest_lateness() -> dict[str, list[Lateness]]:
    """Rank 0: each group's most costly late ranks in the last judged window (for metrics); else empty."""
    detector = _detector
    return dict(detector.latest) if detector is not None else {}


def own_waits() -> dict[str, tuple[str, float]]:
    """Each rank: per group, (description, median wait in s) over the detector's last window; else empty."""
    detector = _detector
    return dict(detector.own) if detector is not None else {}


def _forget_after_fork() -> None:
    global _detector
    _detector = None  # a forked child (a DataLoader worker) has no detector thread, and starts none


os.register_at_fork(after_in_child=_forget_after_fork)
