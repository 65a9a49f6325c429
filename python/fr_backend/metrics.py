"""Progress metrics for Prometheus, through prometheus_client (docs/usage.md, "Metrics").

Off unless asked for. Every rank of a frnccl job refreshes its own figures every FRNCCL_METRICS_INTERVAL_SEC
from the native recorder (`native().metrics_snapshot()`), on a daemon thread that never waits on a peer, a
store or a collective:

* FRNCCL_METRICS_PORT=P: one endpoint per host, `http://<host>:P/metrics`, for every rank of that host that
  was given the same port. Each rank writes its figures into a folder private to the user and the port
  (`$TMPDIR/frnccl-metrics-<uid>/<P>`); the rank holding that folder's lock serves them all. When it exits
  the lock goes with it, and another rank of the host takes over at its next refresh.
* FRNCCL_METRICS_DIR=D: each rank writes `D/frnccl_rank<R>.prom` (node_exporter's textfile collector).

Nothing here may end or slow the job: a setting that cannot be used, a port that is taken or a folder that
cannot be written is said in one line, and the job goes on without that part.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import stat
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from .config import DEFAULT_METRICS_ADDR, DEFAULT_METRICS_INTERVAL_S, ConfigError, MetricsSettings, metrics_settings

# A rank file is read only if small and fresh: one rank's figures are about 1 KB a group.
MAX_RANK_FILE_BYTES = 4 << 20
# A rank that takes the serving lock while the last holder's process is still ending finds the port still bound
# for a moment: it says so only if the port stays taken this long.
BIND_GRACE_S = 10.0
RANK_FILE = re.compile(r"rank-(\d{1,9})-(\d{1,10})\.prom")
MAX_LABEL_CHARS = 200


def _say(line: str) -> None:
    print(f"frnccl: metrics: {line}", file=sys.stderr, flush=True)


def _label(value: object) -> str:
    text = str(value)
    return "".join(c if c.isprintable() else "?" for c in text[:MAX_LABEL_CHARS])


@dataclass
class Identity:
    rank: int
    world_size: int
    job_id: str
    life: int = 0


class RankCollector:
    """This rank's figures, as prometheus_client families, read fresh from the recorder at each collect. Every
    series carries job_id and rank, so that two jobs sharing a host and a port never make the same series."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        from ._native import native

        snap = native().metrics_snapshot()
        me = [_label(self.identity.job_id), str(self.identity.rank)]
        base = ["job_id", "rank"]
        info = InfoMetricFamily("frnccl_rank", "A rank of a frnccl job: its host, pid, world size and life.", labels=base)
        info.add_metric(me, {"host": _label(socket.gethostname()), "pid": str(os.getpid()),
                             "world_size": str(self.identity.world_size), "life": str(snap["life"])})
        yield info
        group = base + ["pg", "pg_desc"]
        enqueued = GaugeMetricFamily("frnccl_last_enqueued_seq", "The group's last op this rank enqueued (seq; kind: collective or p2p).", labels=group + ["kind"])
        started = GaugeMetricFamily("frnccl_last_started_seq", "The group's last op this rank saw start.", labels=group + ["kind"])
        completed = GaugeMetricFamily("frnccl_last_completed_seq", "The group's last op this rank saw complete.", labels=group + ["kind"])
        stalled = GaugeMetricFamily("frnccl_stalled_seconds", "Seconds since the group last made progress on this rank while an op of it is pending; 0 when none is.", labels=group)
        ops = CounterMetricFamily("frnccl_ops", "Ops this rank issued in the group, by kind.", labels=group + ["op"])
        wait = GaugeMetricFamily("frnccl_op_wait_median_seconds", "Median time from enqueue to completion of the group's newest completed collectives on this rank (up to 64): the rank the others wait for waits least.", labels=group)
        for g in snap["groups"]:
            labels = me + [_label(g["name"]), _label(g["desc"])]
            for kind in ("collective", "p2p"):
                enqueued.add_metric(labels + [kind], g[f"last_enqueued_{kind}"])
                started.add_metric(labels + [kind], g[f"last_started_{kind}"])
                completed.add_metric(labels + [kind], g[f"last_completed_{kind}"])
            stalled.add_metric(labels, g["stalled_s"])
            for op, count in g["ops"].items():
                ops.add_metric(labels + [_label(op)], count)
            if g["wait_samples"] > 0:
                wait.add_metric(labels, g["wait_median_s"])
        yield from (enqueued, started, completed, stalled, ops, wait)
        from .slow import latest_lateness, own_waits

        window_wait = GaugeMetricFamily("frnccl_slow_wait_median_seconds", "From the slow-rank detector, on every rank: its median wait in the group's collectives over the detector's last window (what it reports to the judge). The rank the others wait for waits least: the group's median of it less a rank's own is how late that rank is (docs/usage.md, query each_rank_lateness).", labels=group)
        for name, (desc, median_s) in own_waits().items():
            window_wait.add_metric(me + [_label(name), _label(desc)], median_s)
        yield window_wait
        lateness = GaugeMetricFamily("frnccl_rank_lateness_seconds", "From the slow-rank detector (served by rank 0, which judges): how late the group's most costly ranks entered its collectives in the last window, on median, above what they were at the start (late_rank: the rank; share: of the window the others lost to it, in frnccl_rank_lateness_share).", labels=group + ["late_rank"])
        lateness_share = GaugeMetricFamily("frnccl_rank_lateness_share", "The share of the window the group's other ranks lost waiting for late_rank (the slow-rank detector).", labels=group + ["late_rank"])
        for name, late in latest_lateness().items():
            for x in late:
                labels = me + [_label(name), _label(x.desc), str(x.rank)]
                lateness.add_metric(labels, max(0.0, x.late_s))
                lateness_share.add_metric(labels, x.share)
        yield from (lateness, lateness_share)
        lag = GaugeMetricFamily("frnccl_watchdog_lag_seconds", "How late the watchdog saw timed ops complete (stat: max or mean).", labels=base + ["stat"])
        beat = GaugeMetricFamily("frnccl_watchdog_heartbeat_age_seconds", "Seconds since the watchdog's last pass.", labels=base)
        if snap["watchdog"]:
            lag.add_metric(me + ["max"], snap["watchdog_max_lag_s"])
            lag.add_metric(me + ["mean"], snap["watchdog_mean_lag_s"])
            beat.add_metric(me, snap["watchdog_beat_age_s"])
        yield lag
        yield beat
        incidents = CounterMetricFamily("frnccl_incidents", "Incidents (job-wide dumps) this rank took part in (failure: whether one of a failure).", labels=base + ["failure"])
        incidents.add_metric(me + ["true"], snap["failure_incidents"])
        incidents.add_metric(me + ["false"], snap["incidents"] - snap["failure_incidents"])
        yield incidents
        verdict = InfoMetricFamily("frnccl_last_verdict", "The latest verdict this rank learned: its incident, kind and the ranks it names.", labels=base)
        if snap["verdict_incident"]:
            verdict.add_metric(me, {"incident": _label(_text(snap["verdict_incident"])), "kind": _verdict_kind(snap["verdict_json"]),
                                    "culprits": ",".join(str(int(r)) for r in snap["verdict_culprits"][:64])})
        yield verdict
        updated = GaugeMetricFamily("frnccl_metrics_updated_timestamp_seconds", "When this rank's figures were taken (Unix time): alert on time() minus it, since a rank that was killed leaves its last figures behind.", labels=base)
        updated.add_metric(me, time.time())
        yield updated


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _verdict_kind(raw: bytes) -> str:
    """The verdict JSON's kind: it came through the store (any client may have written it), so anything that
    is not a short printable string is left out."""
    try:
        kind = json.loads(_text(raw)).get("kind", "") if raw else ""
    except Exception:  # noqa: BLE001 - garbage, or nested deep enough to exhaust the parser
        return ""
    return _label(kind)[:64] if isinstance(kind, str) else ""


def _checked_folder(path: str, private: bool, mode: int = 0o700) -> str:
    """Creates `path` if missing (`mode`); raises OSError naming what is wrong unless it is a folder (not a link)
    that no other user can write, and, if `private`, this user's. A folder others can write would let them feed
    the endpoint figures, or plant links where this rank writes."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} is not a folder")
    if private and st.st_uid != os.getuid():
        raise OSError(f"{path} belongs to another user (uid {st.st_uid})")
    if st.st_mode & (0o022 if private else 0o002):
        raise OSError(f"{path} can be written by others (mode {stat.S_IMODE(st.st_mode):o})")
    return path


def spool_folder(port: int) -> str:
    parent = _checked_folder(os.path.join(tempfile.gettempdir(), f"frnccl-metrics-{os.getuid()}"), private=True)
    return _checked_folder(os.path.join(parent, str(port)), private=True)


class HostCollector:
    """What the host's endpoint serves: every rank file of the spool folder, merged family by family. Read on
    the exporter thread once per refresh (read_all); a scrape only hands out the last result."""

    def __init__(self, folder: str, max_age_s: float) -> None:
        self.folder = folder
        self.max_age_s = max_age_s
        self.families: list[Any] = []

    def _rank_texts(self) -> Iterator[str]:
        try:
            names = os.listdir(self.folder)
        except OSError:
            return
        now = time.time()
        for name in sorted(names):
            match = RANK_FILE.fullmatch(name)
            if match is None:
                continue
            path = os.path.join(self.folder, name)
            pid = int(match.group(2))
            try:
                if pid != os.getpid():
                    os.kill(pid, 0)
            except ProcessLookupError:
                _remove(path)  # its rank is gone
                continue
            except (PermissionError, OverflowError, ValueError):
                continue
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RANK_FILE_BYTES or now - st.st_mtime > self.max_age_s:
                    continue
                data = f.read(MAX_RANK_FILE_BYTES + 1)
            yield data.decode("utf-8", errors="replace")

    def read_all(self) -> None:
        from prometheus_client.core import Metric
        from prometheus_client.parser import text_string_to_metric_families

        merged: dict[str, Any] = {}
        for text in self._rank_texts():
            try:
                families = list(text_string_to_metric_families(text))
            except Exception:  # noqa: BLE001 - a file cut or garbled: left out until it is whole again
                continue
            for family in families:
                if not family.name.startswith("frnccl_"):
                    continue
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation, family.type)
                if into.type == family.type:
                    into.samples.extend(family.samples)
        self.families = list(merged.values())

    def collect(self) -> Iterator[Any]:
        yield from self.families


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class Exporter:
    """The per-process metrics thread (daemon, SIGTERM blocked: frnccl's SIGTERM handler must run on a thread
    that holds no lock of the recorder's). It owns every file this process writes for metrics and, while it
    serves, the spool folder's lock and the HTTP server (whose threads it starts, with its signal mask). It
    reads only this process's recorder, its own files and the spool folder."""

    def __init__(self, settings: MetricsSettings, identity: Identity) -> None:
        self.settings = settings
        self.identity = identity
        self.pid = os.getpid()
        self.stop = threading.Event()
        self.said: set[str] = set()
        self.spool: str | None = None
        self.rank_file: str | None = None
        self.textfile_dir: str | None = None
        self.textfile_path: str | None = None
        self.lock_fd: int | None = None
        self.locked_at = 0.0
        self.host: HostCollector | None = None
        self.server: Any = None
        self.registry: Any = None
        self.thread = threading.Thread(target=self._run, name="frnccl-metrics", daemon=True)

    def say_once(self, key: str, line: str) -> None:
        if key not in self.said:
            self.said.add(key)
            _say(line)

    def start(self) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(RankCollector(self.identity))
        self.thread.start()

    def _set_up(self) -> bool:
        """The folders, on this thread (a hung network folder must not hold up init_process_group)."""
        if self.settings.port is not None:
            try:
                self.spool = spool_folder(self.settings.port)
            except OSError as e:
                self.say_once("spool", f"no endpoint on port {self.settings.port}: its folder cannot be used ({e}); the job goes on")
        if self.settings.textfile_dir is not None:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(self.settings.textfile_dir)), exist_ok=True)
                self.textfile_dir = _checked_folder(self.settings.textfile_dir, private=False, mode=0o755)
            except OSError as e:
                self.say_once("textfile", f"FRNCCL_METRICS_DIR cannot be used ({e}); no textfiles; the job goes on")
        return self.spool is not None or self.textfile_dir is not None

    def _run(self) -> None:
        import signal

        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        if not self._set_up():
            return
        while not self.stop.is_set():
            try:
                self.refresh()
            except Exception as e:  # noqa: BLE001 - metrics must never end the job
                self.say_once(f"refresh:{type(e).__name__}", f"refresh failed ({type(e).__name__}: {str(e)[:200]}); trying again every {self.settings.interval_s:g} s")
            self.stop.wait(self.settings.interval_s)

    def _write(self, path: str | None, attr: str) -> None:
        from prometheus_client import write_to_textfile

        old = getattr(self, attr)
        if old is not None and old != path:
            _remove(old)  # a new life with another rank
        setattr(self, attr, path)
        if path is not None:
            write_to_textfile(path, self.registry)

    def refresh(self) -> None:
        if self.textfile_dir is not None:
            try:
                self._write(os.path.join(self.textfile_dir, f"frnccl_rank{self.identity.rank}.prom"), "textfile_path")
            except OSError as e:
                self.say_once("textfile-write", f"cannot write into {self.textfile_dir} ({e}); trying again every {self.settings.interval_s:g} s")
        if self.spool is None:
            return
        self._write(os.path.join(self.spool, f"rank-{self.identity.rank}-{os.getpid()}.prom"), "rank_file")
        if self.server is None:
            self._serve_if_free()
        if self.host is not None and self.server is not None:
            self.host.read_all()

    def _serve_if_free(self) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        assert self.spool is not None and self.settings.port is not None
        if self.lock_fd is None:
            fd = os.open(os.path.join(self.spool, "server.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                return  # another rank of this host serves
            self.lock_fd = fd
            self.locked_at = time.monotonic()
        if self.host is None:
            self.host = HostCollector(self.spool, max(60.0, 10 * self.settings.interval_s))
        self.host.read_all()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.host)
        try:
            # prometheus_client before 0.17 returns None: any true value marks this process as serving.
            self.server = start_http_server(self.settings.port, addr=self.settings.addr, registry=registry) or True
        except OSError as e:
            # The last holder's process may still be ending, its socket open a moment after its lock went: then
            # wait quietly (bounded) for it to go. Otherwise another program holds the port.
            if not self._last_holder_ending() or time.monotonic() - self.locked_at >= BIND_GRACE_S:
                self.say_once("bind", f"cannot serve http://{self.settings.addr}:{self.settings.port}/metrics ({e.strerror or e}); "
                                      f"no endpoint from this host until it is free; the job goes on")
            return
        self.say_once("serving", f"serving this host's ranks at http://{self.settings.addr}:{self.settings.port}/metrics")
        try:
            with open(os.path.join(self.spool, "server.pid"), "w") as f:  # read by the next holder
                f.write(str(os.getpid()))
        except OSError:
            pass

    def _last_holder_ending(self) -> bool:
        """Whether the process that served last, by server.pid (a file of this user's private folder), still runs."""
        assert self.spool is not None
        try:
            fd = os.open(os.path.join(self.spool, "server.pid"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd) as f:
                raw = f.read(16).strip()
            pid = int(raw)
            if pid <= 0 or pid == os.getpid():
                return False
            os.kill(pid, 0)
        except (OSError, ValueError, OverflowError):
            return False
        return True

    def close(self) -> None:
        """At exit: the files go, then the lock (another rank of the host takes over). The listening socket is
        left to the process's end, a moment later: shutting the server down would wait for its loop."""
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=0.2)
        for path in (self.rank_file, self.textfile_path):
            if path is not None:
                _remove(path)
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


_exporter: Exporter | None = None
_exporter_lock = threading.Lock()


def _close_at_exit() -> None:
    exporter = _exporter
    if exporter is not None and exporter.pid == os.getpid() and exporter.registry is not None:
        exporter.close()


def note_life(rank: int, world_size: int, job_id: str, env: Mapping[str, str] | None = None) -> None:
    """Called as a frnccl group begins a life: starts the exporter once per process when asked for, and keeps
    its identity current (a new life may give this process another rank). Never raises."""
    global _exporter
    try:
        with _exporter_lock:
            if _exporter is not None:
                _exporter.identity.rank = rank
                _exporter.identity.world_size = world_size
                _exporter.identity.job_id = job_id
                return
            settings = metrics_settings(os.environ if env is None else env)
            if not settings.wanted:
                return
            _exporter = Exporter(settings, Identity(rank, world_size, job_id))  # said once: not again next life
            try:
                import prometheus_client  # noqa: F401
            except ImportError:
                _say("FRNCCL_METRICS_PORT/FRNCCL_METRICS_DIR need prometheus_client (pip install prometheus_client); no metrics; the job goes on")
                return
            _exporter.start()
            import atexit

            atexit.register(_close_at_exit)
    except ConfigError as e:
        _say(f"{e}; no metrics; the job goes on")
        _exporter = Exporter(MetricsSettings(None, DEFAULT_METRICS_ADDR, None, DEFAULT_METRICS_INTERVAL_S), Identity(rank, world_size, job_id))
    except Exception as e:  # noqa: BLE001 - metrics must never end the job
        _say(f"not started ({type(e).__name__}: {str(e)[:200]}); the job goes on")


def _forget_after_fork() -> None:
    """A forked child (a DataLoader worker) has no exporter thread, and its exit must not touch the parent's
    files (_close_at_exit checks the pid). Its copies of the lock and of the listening socket are closed, so
    that neither outlives the serving rank: another rank takes over when that one exits."""
    global _exporter
    exporter, _exporter = _exporter, None
    if exporter is None:
        return
    if exporter.lock_fd is not None:
        try:
            os.close(exporter.lock_fd)
        except OSError:
            pass
        exporter.lock_fd = None
    server = exporter.server
    if isinstance(server, tuple) or hasattr(server, "socket"):
        try:
            (server[0] if isinstance(server, tuple) else server).socket.close()
        except Exception:  # noqa: BLE001
            pass


os.register_at_fork(after_in_child=_forget_after_fork)
