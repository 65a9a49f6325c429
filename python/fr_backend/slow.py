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


def parse_report(line: bytes) -> RankReport | None:
    """One rank's line from the store, or None where it is not one (anything may be there)."""
    if len(line) > MAX_LINE_BYTES:
        return None
    try:
        d = json.loads(line)
        groups = []
        for g in d["g"][:MAX_GROUPS]:
            qs = tuple(float(x) for x in g["q"])
            if len(qs) != len(QUANTILES) or not all(math.isfinite(x) and 0 <= x < 1e6 for x in qs):
                return None
            groups.append(GroupReport(_text(g["n"]), _text(g["d"]), int(g["s"]), int(g["r"]), _text(g["o"]),
                                      int(g["c"]), qs))
        share = float(d["ws"])
        if not math.isfinite(share) or share < 0:
            return None
        rank = int(d["rank"])
        if rank < 0:
            return None
        return RankReport(rank, _text(d["host"]), int(d["pid"]), share, tuple(groups))
    except (ValueError, KeyError, TypeError, IndexError, OverflowError, AttributeError):
        return None


def own_report(rank: int, groups: list[dict[str, Any]], ops_before: dict[str, dict[str, int]],
               window_s: float) -> tuple[RankReport, dict[str, dict[str, int]]]:
    """This rank's report from `collective_waits`'s groups; also the op counts to diff the next window with."""
    out = []
    total_wait_s = 0.0
    ops_now: dict[str, dict[str, int]] = {}
    for g in groups:
        name = str(g["name"])
        ops_now[name] = dict(g["ops"])
        waits = [w / 1e9 for w in g["waits_ns"]]
        total_wait_s += sum(waits)
        if not waits:
            continue
        before = ops_before.get(name, {})
        ran = {op: n - before.get(op, 0) for op, n in g["ops"].items() if n > before.get(op, 0)}
        op = max(ran, key=lambda k: ran[k]) if ran else "collective"
        out.append(GroupReport(name, str(g["desc"]), int(g["size"]), int(g["rank_in_group"]), op, len(waits),
                               quantiles(waits)))
    report = RankReport(rank, socket.gethostname(), os.getpid(), total_wait_s / window_s, tuple(out[:MAX_GROUPS]))
    return report, ops_now


def report_line(report: RankReport) -> bytes:
    d = {"rank": report.rank, "host": report.host, "pid": report.pid, "ws": round(report.wait_share, 4),
         "g": [{"n": g.name, "d": g.desc, "s": g.size, "r": g.rank_in_group, "o": g.op, "c": g.ops,
                "q": [round(q, 6) for q in g.quantiles_s]} for g in report.groups]}
    return (json.dumps(d, separators=(",", ":")) + "\n").encode()


def state_value(judge: SlowJudge, window: int, window_s: float) -> bytes:
    """What `frnccl status` shows: per group its latest lateness, most costly first, and the slow ranks."""
    groups = {name: [{"rank": x.rank, "late_ms": round(x.late_s * 1e3, 2), "share": round(x.share, 4),
                      "op": x.op, "desc": x.desc} for x in late] for name, late in judge.last.items()}
    return json.dumps({"window": window, "window_s": window_s, "slow": judge.slow_ranks(), "groups": groups},
                      separators=(",", ":")).encode()


@dataclass
class Identity:
    rank: int
    world_size: int


class Detector:
    """The per-process thread, and, on rank 0, the judge. It uses the job's root store, from this thread only
    (a store that does not answer holds up this thread, never init)."""

    def __init__(self, settings: SlowSettings, identity: Identity, store: Any) -> None:
        self.settings = settings
        self.identity = identity
        self.root = store
        self.store: Any = None
        self.stop = threading.Event()
        self.said: set[str] = set()
        self.judge = SlowJudge(min_share=settings.min_share)
        self.ops_before: dict[str, dict[str, int]] = {}
        self.life = -1
        self.acked = True
        self.first_window = -1
        self.latest: dict[str, list[Lateness]] = {}  # rank 0: each group's lateness in the last judged window
        self.thread = threading.Thread(target=self._run, name="frnccl-slow", daemon=True)

    def say_once(self, key: str, line: str) -> None:
        if key not in self.said:
            self.said.add(key)
            _say(f"slow-rank detection: {line}")

    def new_store(self, store: Any) -> None:
        self.root, self.store = store, None

    def _connect(self) -> bool:
        # The job's own connection, not a clone: one more connection per rank is 100,000 more on the store
        # host of a large job, for one request a window. Its client serializes the calls of both threads.
        if self.store is None:
            self.store = self.root
        return self.store is not None

    def _run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        from ._native import native

        native().date_completions(True)
        window_ns = int(self.settings.window_s * 1e9)
        window = time.time_ns() // window_ns + 1  # the first whole window
        while not self.stop.wait(max(0.0, (window * window_ns - time.time_ns()) / 1e9)):
            try:
                self._post(native(), window - 1, window_ns)
                if self.identity.rank == 0:
                    grace = min(2.0, self.settings.window_s / 4)
                    if self.stop.wait(grace):
                        return
                    self._judge(window - 1)
            except Exception as e:  # noqa: BLE001 - detection must never end the job
                self.say_once(f"{type(e).__name__}", f"a window was skipped ({type(e).__name__}: {str(e)[:160]}); it goes on")
                self.store = None
            window = max(window + 1, time.time_ns() // window_ns + 1)

    def _post(self, C: Any, window: int, window_ns: int) -> None:
        life, groups = C.collective_waits(window * window_ns, SCANNED_ENTRIES, MAX_WAITS_PER_GROUP)
        if life != self.life:
            self.life, self.ops_before = life, {}
        report, self.ops_before = own_report(self.identity.rank, groups, self.ops_before, window_ns / 1e9)
        if not any(g.ops >= 1 for g in report.groups) or not self._connect():
            return
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
                if window - int(self.store.get(ACK_KEY)) <= 2 * ACK_EVERY:
                    return True
            except ValueError:
                pass
        return window - self.first_window <= 2 * ACK_EVERY

    def _judge(self, window: int) -> None:
        key = window_key(window)
        if not self._connect():
            return
        self.store.set(ACK_KEY, str(window))
        if not self.store.check([key]):
            return
        raw = self.store.get(key)
        self.store.delete_key(key)
        self.store.delete_key(window_key(window - 2))  # re-made by a rank whose line came after it was read
        reports: dict[int, RankReport] = {}
        for line in raw.split(b"\n"):
            report = parse_report(line) if line else None
            if report is not None and report.rank < max(self.identity.world_size, 1):
                reports[report.rank] = report  # one per rank: a later line replaces an earlier one
        for finding in self.judge.judge(list(reports.values()), self.settings.window_s):
            _say(finding_line(finding))
        self.latest = {name: list(late) for name, late in self.judge.last.items()}
        self.store.set(STATE_KEY, state_value(self.judge, window, self.settings.window_s))


_detector: Detector | None = None
_lock = threading.Lock()


def note_group(store: Any, rank: int, world_size: int, env: Any = None) -> None:
    """Called as a frnccl group is created: starts the detector once per process, and keeps its rank, world
    size and store current (a new life may change all three). Never raises."""
    global _detector
    try:
        with _lock:
            while hasattr(store, "underlying_store") and store.underlying_store is not None:
                store = store.underlying_store  # keys of one job, whatever group made the store
            if _detector is not None:
                if _detector.identity.rank != rank or _detector.identity.world_size != world_size or _detector.root is not store:
                    _detector.identity = Identity(rank, world_size)
                    _detector.new_store(store)
                    _detector.judge = SlowJudge(min_share=_detector.settings.min_share)
                return
            settings = slow_settings(os.environ if env is None else env)
            if not settings.enabled or world_size < 2:
                return
            _detector = Detector(settings, Identity(rank, world_size), store)
            _detector.thread.start()
    except ConfigError as e:
        _say(f"slow-rank detection: {e}; it is off; the job goes on")
    except Exception as e:  # noqa: BLE001
        _say(f"slow-rank detection: not started ({type(e).__name__}: {str(e)[:160]}); the job goes on")


def latest_lateness() -> dict[str, list[Lateness]]:
    """Rank 0: each group's most costly late ranks in the last judged window (for metrics); else empty."""
    detector = _detector
    return dict(detector.latest) if detector is not None else {}


def _forget_after_fork() -> None:
    global _detector
    _detector = None  # a forked child (a DataLoader worker) has no detector thread, and starts none


os.register_at_fork(after_in_child=_forget_after_fork)
