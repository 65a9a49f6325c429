"""FRNCCL_* settings: parsed and validated once, with one-line errors that name the variable."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Callable, Mapping, TypeVar

T = TypeVar("T")

DUMP_FORMATS = ("compact", "pickle", "json", "chrome")
DEFAULT_DUMP_FORMATS = ("compact",)
STACK_MODES = ("python", "cpp", "none")
ON_TIMEOUT = ("raise", "exit")


class ConfigError(ValueError):
    """A FRNCCL_* variable holds a value frnccl cannot use."""


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    meaning: str


# The documented configuration; docs/configuration.md is generated from it.
SETTINGS: tuple[Setting, ...] = (
    Setting("FRNCCL_ENABLE", "0", "1: every group the job creates on gloo or nccl (init_process_group with \"nccl\", \"gloo\", a \"cpu:gloo,cuda:nccl\" spec or no backend; new_group, new_subgroups, init_device_mesh, split_group) is created through frnccl, with no change to the training code; torch and libraries still see the names \"gloo\"/\"nccl\" (docs/usage.md). Read at `import torch`, by the entry point; 0 or unset: nothing of torch is replaced. It also makes frnccl take torch's recorder settings where its own are unset: FRNCCL_BUFFER_SIZE from TORCH_FR_BUFFER_SIZE (else TORCH_NCCL_TRACE_BUFFER_SIZE), FRNCCL_DUMP_DIR from the folder of the TORCH_FR_DUMP_TEMP_FILE prefix (torch writes `<prefix><rank>`; frnccl writes into that folder). torch's own recorder stays off in these groups."),
    Setting("FRNCCL_BUFFER_SIZE", "20000", "Entries in the per-process ring buffer; 0 turns recording off."),
    Setting("FRNCCL_STACKS", "python", "Caller stack captured per op: python, cpp or none. Symbolized only at dump time."),
    Setting("FRNCCL_DUMP_DIR", "$TMPDIR/frnccl-dumps (/tmp/frnccl-dumps)", "Where dumps go: one folder per incident, created if missing."),
    Setting("FRNCCL_VERDICT_FILE", "", "Also write each incident's verdict as JSON to this path (the rank that judged it writes it, whole: a restart script reads the latest; docs/dump-format.md, \"Verdict\"); put it where the script can read it. It always goes to `<incident folder>/verdict.json` on that rank too. A write that fails is logged; the job goes on."),
    Setting("FRNCCL_DUMP_FORMATS", "compact", "Comma-separated formats to write: compact (gzip'ed JSON with the entries as columns, about 12.6 B per entry; what `frnccl analyze` reads fastest), pickle (torch's format: its fr_trace reads the folder as is; `frnccl export --torch` makes one from any dump), json (the same dict as plain JSON), chrome (a Chrome/Perfetto trace). docs/dump-format.md."),
    Setting("FRNCCL_DUMP_TIMEOUT_SEC", "60", "How long the rank that triggers a dump waits for every rank to write."),
    Setting("FRNCCL_DUMP_MIN_INTERVAL_SEC", "10", "Storm bound: a job-wide dump that another rank, the dump signal or `frnccl dump` asks for is dropped (logged) if this process wrote one of its kind (failure: timeout or error; or other) less than this long ago; 0 turns the interval off. A failure this process's own watchdog sees is always dumped. A second `frnccl dump` within the interval is dropped on every rank (the CLI then reports 0 ranks written)."),
    Setting("FRNCCL_DUMP_MAX_COUNT", "100", "Storm bound: at most this many job-wide dumps that this process did not ask for itself are written (later ones are dropped, logged); 0: no cap."),
    Setting("FRNCCL_COORD_CHECK_MS", "1000", "How often a rank looks in the store for a job-wide dump request where the request cannot be pushed to it: while its waiting connection to the store is being replaced, its own connection is lost, a request number's request is missing, or its request joined another rank's incident. An idle healthy rank does not poll: a trigger wakes it."),
    Setting("FRNCCL_HEARTBEAT_TIMEOUT_SEC", "480", "If the watchdog makes no progress this long, dump and end the process; 0 disables. Otherwise at least 10 times FRNCCL_WATCHDOG_POLL_MS: an idle watchdog beats once per poll."),
    Setting("FRNCCL_WATCHDOG_POLL_MS", "100", "Longest pause of the watchdog when idle (it polls every 10 ms while ops are in flight)."),
    Setting("FRNCCL_SYMBOLIZE_TIMEOUT_MS", "2000", "How long a dump waits for the GIL to symbolize stacks before writing them unsymbolized; 0 never symbolizes."),
    Setting("FRNCCL_ON_TIMEOUT", "raise", "After a timeout's dump: raise (abort communicators; the waiting call and every later call into a frnccl group raise) or exit (end the process)."),
    Setting("FRNCCL_DUMP_SIGNAL", "SIGUSR1", "Signal that asks the whole job to dump (a name, a number, or none). Not a fatal or job-control signal, nor one the C library keeps for itself (32 and 33 with glibc: real-time signals start at SIGRTMIN). A handler the program installs for it with signal.signal (Slurm --signal users, Lightning's auto-requeue) runs after frnccl's. Under FRNCCL_ENABLE=1 it is handled from `import torch` on: a process with no frnccl group prints one line and goes on."),
    Setting("FRNCCL_DUMP_ON_TEARDOWN", "0", "1: this rank dumps when destroy_process_group() ends its last frnccl group (never symbolized)."),
    Setting("FRNCCL_DUMP_ON_TERMINATE_MS", "1000", "When SIGTERM (a launcher stopping the job, as torchrun stops the other workers once one failed) or SIGABRT (an abort: an uncaught C++ exception, a failed check) reaches a process with a frnccl group alive, it writes a quick dump (never symbolized) and holds the signal up to this many ms for it; then the handler that was there before runs, or the default action ends the process as it would have. The dump joins the job-wide incident in progress, if any; else an abort opens one, and a SIGTERM writes its own incident (reason sigterm). Skipped when this rank's part of the failure is already written or being written; a part being written that waits for the GIL to symbolize stacks is then written unsymbolized. 0: both signals are left alone."),
    Setting("FRNCCL_DUMP_ON_EXCEPTION_MS", "3000", "A rank that leaves the job with an uncaught Python exception writes its part of the incident it opens, and waits for the other ranks' parts (and the verdict), at most this many ms in all before it goes on leaving: it does not need their parts to leave. Its own part is written first, whatever the bound. Any rank that exits while the verdict of a failure it took part in is due waits for it up to this bound too, so that its error file, and torchrun's summary, say it."),
    Setting("FRNCCL_GPU_TIMING", "off", "GPU start/end timestamps for CUDA ops: off, all, or N (every Nth op). A timed op costs about 5-10 us of CPU and 6 us of GPU time (two timed CUDA events; docs/design.md)."),
    Setting("FRNCCL_SETTLE_BY_TORCH_WATCHDOG", "1", "1: a synchronous op of torch's ProcessGroupNCCL (it returns no Work; torch 2.15's nccl2 returns one for every op, and frnccl follows that) is seen complete through the progress torch's own NCCL watchdog publishes for the inner group, with no end event of frnccl's, while that group has run only collectives on one stream; completion is then seen up to 100 ms later. 0: end events only (FRNCCL_END_EVENT_INTERVAL_US). docs/design.md, \"Settling by torch's watchdog\"."),
    Setting("FRNCCL_END_EVENT_INTERVAL_US", "0", "For synchronous CUDA ops that return no Work and that torch's watchdog does not settle. 0: an end event after every one. N: at most one per N us per thread and stream, the rest complete with the next; cheaper (1-2.5 us less CPU per small synchronous all_reduce on 2xH200, docs/benchmarks.md, ninth run), but a hang is then placed only within that window."),
    Setting("FRNCCL_METRICS_PORT", "", "Serve progress metrics for Prometheus at http://<host>:PORT/metrics, one endpoint per host for every rank of that host given this port (the first rank to start serves; another takes over when it exits). Unset: no port is opened. A bad value, a port taken by another program or a folder that cannot be used is said in one line; the job goes on. Needs prometheus_client (docs/usage.md, \"Metrics\")."),
    Setting("FRNCCL_METRICS_ADDR", "0.0.0.0", "The numeric address the metrics endpoint binds to: 0.0.0.0 every IPv4 interface (localhost included), 127.0.0.1 this host only, :: IPv6."),
    Setting("FRNCCL_METRICS_DIR", "", "Also write each rank's metrics to DIR/frnccl_rank<R>.prom, whole, at each refresh: for node_exporter's textfile collector (--collector.textfile.directory=DIR)."),
    Setting("FRNCCL_SLOW_DETECT", "0", "1: name, in the job's log (rank 0's), a rank that makes the others wait in their collectives, while the job runs, and again when it is well (docs/usage.md, \"Slow ranks\"); `frnccl status` shows each group's lateness. 0 (default, until it meets its cost and scale bars: docs/benchmarks.md): off. A bad value is said in one line; the job goes on."),
    Setting("FRNCCL_SLOW_WINDOW_SEC", "10", "The slow-rank detector's window (1 to 3600 s): each rank posts one line per window to the store; a rank is named after 2 windows in a row, once its group ran 3 windows to learn what is the program's own."),
    Setting("FRNCCL_SLOW_MIN_SHARE", "0.05", "How much of their time the other ranks must lose to a rank for it to be named slow (0.01 to 1)."),
    Setting("FRNCCL_METRICS_INTERVAL_SEC", "5", "How often each rank refreshes its metrics (0.1 to 3600 s); the endpoint serves the latest."),
    Setting("FRNCCL_JOB_ID", "", "Job id written into dumps; defaults to TORCHELASTIC_RUN_ID, SLURM_JOB_ID, MAST_HPC_JOB_NAME."),
)


# Upper bounds of the time settings: far beyond any useful value, and small enough that the C++ side can
# hold them (int64) and turn them into nanoseconds without overflow. Without them a huge value failed
# later, in the native configure() call, with a pybind11 cast error that did not name the variable.
MAX_SECONDS = 7 * 24 * 3600  # one week
MAX_MS = MAX_SECONDS * 1000
MAX_GPU_TIMING_EVERY = 1_000_000_000
MAX_END_EVENT_INTERVAL_US = 1_000_000  # one second: a longer interval only delays completion
MAX_DUMP_COUNT = 1_000_000
MAX_TERMINATE_DUMP_MS = 60_000  # launchers SIGKILL within 30 s of SIGTERM (torchrun, Slurm's default KillWait)


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0, maximum: int | None = None) -> int:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be at most {maximum}, got {value}")
    return value


# 10 million entries is about 3.5 GB of ring buffer per process: surely a typo beyond that.
MAX_BUFFER_SIZE = 10_000_000


def _bounded(env: Mapping[str, str], name: str, default: int, maximum: int) -> int:
    return _int(env, name, default, maximum=maximum)


def _text(name: str, raw: str) -> str:
    """A value frnccl hands to C++ as a string must be valid UTF-8 (os.environ keeps other bytes as surrogates)."""
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{name} must be valid UTF-8, got {raw!r}") from None
    return raw


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {raw!r}")
    return raw


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be 0 or 1, got {raw!r}")


def _signal(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    if raw.lower() in ("none", "0", "off"):
        return 0
    if raw.isdecimal():
        number = int(raw)
    else:
        upper = raw.upper()
        member = getattr(signal.Signals, upper if upper.startswith("SIG") else "SIG" + upper, None)
        if member is None:
            raise ConfigError(f"{name} must be a signal name or number, got {raw!r}")
        number = int(member)
    if number in _RESERVED_SIGNALS or not (0 < number < signal.NSIG):
        raise ConfigError(f"{name} cannot be {raw!r}: pick a user signal such as SIGUSR1")
    if number not in signal.valid_signals():
        # glibc keeps the first real-time signals (32 and 33 on Linux) for its threads: sigaction() refuses
        # them, so the signal would keep its default action and end the rank.
        raise ConfigError(
            f"{name} cannot be {raw!r}: the C library reserves it for its own use (real-time signals free for "
            f"programs start at SIGRTMIN, {_sigrtmin()} here); pick a user signal such as SIGUSR1"
        )
    return number


def _sigrtmin() -> int:
    """The C library's SIGRTMIN as this process sees it (a runtime value, not the kernel's 32)."""
    return int(signal.SIGRTMIN) if hasattr(signal, "SIGRTMIN") else 0


def dump_signal(env: Mapping[str, str] | None = None) -> int:
    """FRNCCL_DUMP_SIGNAL: the signal that asks a running job to dump (0: none). Raises ConfigError."""
    return _signal(os.environ if env is None else env, "FRNCCL_DUMP_SIGNAL", int(signal.SIGUSR1))


def stacks_signal() -> int:
    """The signal faulthandler answers with every thread's stack (0: none on this platform)."""
    return int(signal.SIGRTMAX) - 3 if hasattr(signal, "SIGRTMAX") else 0


# Signals a dump request must not take over: fatal or job-control signals,
# ones the runtime relies on, and the one frnccl uses for thread stacks.
_RESERVED_SIGNALS = {
    int(s)
    for s in (
        signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL,
        signal.SIGABRT, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGALRM, signal.SIGPIPE,
        signal.SIGCONT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU,
    )
} | ({stacks_signal()} - {0})


# An idle watchdog passes (and beats) once per FRNCCL_WATCHDOG_POLL_MS. The heartbeat timeout must span many such
# pauses, or a healthy job that sits idle (between epochs, in a long evaluation) is ended as watchdog_stuck.
MIN_POLLS_PER_HEARTBEAT_TIMEOUT = 10


def _heartbeat_covers_polls(heartbeat_ms: int, poll_ms: int) -> None:
    if heartbeat_ms <= 0 or heartbeat_ms >= MIN_POLLS_PER_HEARTBEAT_TIMEOUT * poll_ms:
        return
    need_s = -(-MIN_POLLS_PER_HEARTBEAT_TIMEOUT * poll_ms // 1000)
    raise ConfigError(
        f"FRNCCL_HEARTBEAT_TIMEOUT_SEC ({heartbeat_ms // 1000} s) must be 0 or at least "
        f"{MIN_POLLS_PER_HEARTBEAT_TIMEOUT} times FRNCCL_WATCHDOG_POLL_MS ({poll_ms} ms), the idle watchdog's pause "
        f"between heartbeats: set FRNCCL_HEARTBEAT_TIMEOUT_SEC to {need_s} or more, or FRNCCL_WATCHDOG_POLL_MS to "
        f"{heartbeat_ms // MIN_POLLS_PER_HEARTBEAT_TIMEOUT} or less"
    )


def _formats(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    raw = env.get(name, "").strip()
    if raw == "":
        return DEFAULT_DUMP_FORMATS
    parts = tuple(p.strip().lower() for p in raw.split(",") if p.strip())
    bad = [p for p in parts if p not in DUMP_FORMATS]
    if bad or not parts:
        raise ConfigError(f"{name} must list formats from {', '.join(DUMP_FORMATS)}; got {raw!r}")
    return parts


def _gpu_timing(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "off", "0"):
        return 0
    if raw == "all":
        return 1
    if raw.isdecimal():  # isdigit() also takes characters int() refuses, such as superscripts
        every = int(raw)
        if every > MAX_GPU_TIMING_EVERY:
            raise ConfigError(f"{name} must be off, all, or N (every Nth op) up to {MAX_GPU_TIMING_EVERY}; got {raw!r}")
        return every
    raise ConfigError(f"{name} must be off, all, or a positive integer N (every Nth op); got {raw!r}")


def default_dump_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "frnccl-dumps")


def job_id_from(env: Mapping[str, str]) -> str:
    for name in ("FRNCCL_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "MAST_HPC_JOB_NAME", "LSB_JOBID", "PBS_JOBID"):
        if env.get(name):
            return _text(name, env[name])
    return ""


ENABLE = "FRNCCL_ENABLE"


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """FRNCCL_ENABLE's value; raises ConfigError naming it when it is neither 0 nor 1."""
    return _bool(os.environ if env is None else env, ENABLE, False)


@dataclass(frozen=True)
class Adopted:
    """A frnccl setting taken from one of torch's recorder variables (under FRNCCL_ENABLE)."""

    name: str  # the FRNCCL_* setting
    value: str
    source: str  # the torch variable it came from


def _torch_buffer_size(env: Mapping[str, str]) -> tuple[Adopted | None, str | None]:
    for source in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):  # torch's own precedence
        raw = env.get(source, "").strip()
        if raw == "":
            continue
        try:
            _bounded({source: raw}, source, 0, MAX_BUFFER_SIZE)
        except ConfigError as err:
            return None, f"{err}; FRNCCL_BUFFER_SIZE keeps its default"
        return Adopted("FRNCCL_BUFFER_SIZE", raw, source), None
    return None, None


def _torch_dump_folder(env: Mapping[str, str]) -> tuple[Adopted | None, str | None]:
    source = "TORCH_FR_DUMP_TEMP_FILE"
    raw = env.get(source, "").strip()
    if raw == "":
        return None, None
    try:
        # torch writes <prefix><rank>: its folder is where the files land.
        folder = os.path.dirname(os.path.abspath(os.path.expanduser(_text(source, raw))))
        _dump_dir({"FRNCCL_DUMP_DIR": folder})
    except ConfigError as err:
        return None, f"{source}={raw!r} names no usable folder ({err}); FRNCCL_DUMP_DIR keeps its default"
    return Adopted("FRNCCL_DUMP_DIR", folder, source), None


def adopted_torch_settings(env: Mapping[str, str] | None = None) -> tuple[list[Adopted], list[str]]:
    """Under FRNCCL_ENABLE=1, the frnccl settings left unset that torch's recorder variables give values,
    and one line for each torch value that cannot be used (frnccl's default stays)."""
    env = os.environ if env is None else env
    try:
        if not enabled(env):
            return [], []
    except ConfigError:
        return [], []
    adopted: list[Adopted] = []
    problems: list[str] = []
    for name, find in (("FRNCCL_BUFFER_SIZE", _torch_buffer_size), ("FRNCCL_DUMP_DIR", _torch_dump_folder)):
        if env.get(name, "").strip():
            continue
        found, problem = find(env)
        if found is not None:
            adopted.append(found)
        if problem is not None:
            problems.append(problem)
    return adopted, problems


def with_adopted(env: Mapping[str, str]) -> Mapping[str, str]:
    adopted, _ = adopted_torch_settings(env)
    if not adopted:
        return env
    return {**env, **{a.name: a.value for a in adopted}}


@dataclass(frozen=True)
class FrConfig:
    buffer_size: int = 20000
    stacks: str = "python"
    dump_dir: str = field(default_factory=default_dump_dir)
    verdict_file: str = ""
    formats: tuple[str, ...] = DEFAULT_DUMP_FORMATS
    dump_timeout_ms: int = 60_000
    dump_min_interval_ms: int = 10_000
    dump_max_count: int = 100
    coord_check_ms: int = 1000
    heartbeat_timeout_ms: int = 480_000
    watchdog_poll_ms: int = 100
    symbolize_timeout_ms: int = 2000
    on_timeout: str = "raise"
    dump_signal: int = int(signal.SIGUSR1)
    dump_on_teardown: bool = False
    terminate_dump_ms: int = 1000
    exception_exit_ms: int = 3000
    gpu_timing_every: int = 0
    end_event_interval_us: int = 0
    settle_by_torch_watchdog: bool = True
    job_id: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "FrConfig":
        env = with_adopted(os.environ if env is None else env)
        config = cls(
            buffer_size=_bounded(env, "FRNCCL_BUFFER_SIZE", 20000, MAX_BUFFER_SIZE),
            stacks=_choice(env, "FRNCCL_STACKS", "python", STACK_MODES),
            dump_dir=_dump_dir(env),
            verdict_file=_verdict_file(env),
            formats=_formats(env, "FRNCCL_DUMP_FORMATS"),
            dump_timeout_ms=_int(env, "FRNCCL_DUMP_TIMEOUT_SEC", 60, minimum=1, maximum=MAX_SECONDS) * 1000,
            dump_min_interval_ms=_int(env, "FRNCCL_DUMP_MIN_INTERVAL_SEC", 10, maximum=MAX_SECONDS) * 1000,
            dump_max_count=_int(env, "FRNCCL_DUMP_MAX_COUNT", 100, maximum=MAX_DUMP_COUNT),
            coord_check_ms=_int(env, "FRNCCL_COORD_CHECK_MS", 1000, minimum=10, maximum=MAX_MS),
            heartbeat_timeout_ms=_int(env, "FRNCCL_HEARTBEAT_TIMEOUT_SEC", 480, maximum=MAX_SECONDS) * 1000,
            watchdog_poll_ms=_int(env, "FRNCCL_WATCHDOG_POLL_MS", 100, minimum=1, maximum=MAX_MS),
            symbolize_timeout_ms=_int(env, "FRNCCL_SYMBOLIZE_TIMEOUT_MS", 2000, maximum=MAX_MS),
            on_timeout=_choice(env, "FRNCCL_ON_TIMEOUT", "raise", ON_TIMEOUT),
            dump_signal=dump_signal(env),
            dump_on_teardown=_bool(env, "FRNCCL_DUMP_ON_TEARDOWN", False),
            terminate_dump_ms=_int(env, "FRNCCL_DUMP_ON_TERMINATE_MS", 1000, maximum=MAX_TERMINATE_DUMP_MS),
            exception_exit_ms=_int(env, "FRNCCL_DUMP_ON_EXCEPTION_MS", 3000, maximum=MAX_TERMINATE_DUMP_MS),
            gpu_timing_every=_gpu_timing(env, "FRNCCL_GPU_TIMING"),
            end_event_interval_us=_int(env, "FRNCCL_END_EVENT_INTERVAL_US", 0, maximum=MAX_END_EVENT_INTERVAL_US),
            settle_by_torch_watchdog=_bool(env, "FRNCCL_SETTLE_BY_TORCH_WATCHDOG", True),
            job_id=job_id_from(env),
        )
        _heartbeat_covers_polls(config.heartbeat_timeout_ms, config.watchdog_poll_ms)
        return config

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _dump_dir(env: Mapping[str, str]) -> str:
    raw = env.get("FRNCCL_DUMP_DIR", "").strip()
    if raw == "":
        return default_dump_dir()
    path = os.path.abspath(os.path.expanduser(_text("FRNCCL_DUMP_DIR", raw)))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"FRNCCL_DUMP_DIR must be a directory, but {path} is a file")
    return path


def _verdict_file(env: Mapping[str, str]) -> str:
    raw = env.get("FRNCCL_VERDICT_FILE", "").strip()
    if raw == "":
        return ""
    path = os.path.abspath(os.path.expanduser(_text("FRNCCL_VERDICT_FILE", raw)))
    if os.path.isdir(path):
        raise ConfigError(f"FRNCCL_VERDICT_FILE must name a file, but {path} is a directory")
    return path


# The metrics settings (fr_backend.metrics). Unlike the others, a bad value never stops init: the rank says one
# line and runs without metrics; `frnccl config` reports it as it does the others.
DEFAULT_METRICS_ADDR = "0.0.0.0"
DEFAULT_METRICS_INTERVAL_S = 5.0
MIN_METRICS_INTERVAL_S = 0.1
MAX_METRICS_INTERVAL_S = 3600.0


@dataclass(frozen=True)
class MetricsSettings:
    port: int | None  # None: no endpoint
    addr: str
    textfile_dir: str | None  # None: no textfiles
    interval_s: float

    @property
    def wanted(self) -> bool:
        return self.port is not None or self.textfile_dir is not None


def metrics_settings(env: Mapping[str, str]) -> MetricsSettings:
    """The metrics settings; ConfigError (one line naming the variable) for a value that cannot be used. The
    other settings are read only where FRNCCL_METRICS_PORT or FRNCCL_METRICS_DIR asks for metrics."""
    raw_port = env.get("FRNCCL_METRICS_PORT", "").strip()
    raw_dir = env.get("FRNCCL_METRICS_DIR", "").strip()
    if not raw_port and not raw_dir:
        return MetricsSettings(port=None, addr=DEFAULT_METRICS_ADDR, textfile_dir=None, interval_s=DEFAULT_METRICS_INTERVAL_S)
    port: int | None = None
    if raw_port:
        if not raw_port.isascii() or not raw_port.isdigit() or not 1 <= int(raw_port) <= 65535:
            raise ConfigError(f"FRNCCL_METRICS_PORT must be a port number from 1 to 65535, got {raw_port[:40]!r}")
        port = int(raw_port)
    addr = env.get("FRNCCL_METRICS_ADDR", "").strip() or DEFAULT_METRICS_ADDR
    try:
        socket.getaddrinfo(addr, None, proto=socket.IPPROTO_TCP, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        raise ConfigError(f"FRNCCL_METRICS_ADDR must be a numeric IPv4 or IPv6 address, got {addr[:60]!r}") from None
    if raw_dir:
        try:
            raw_dir.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"FRNCCL_METRICS_DIR must be valid UTF-8, got {raw_dir[:60]!r}") from None
    raw_interval = env.get("FRNCCL_METRICS_INTERVAL_SEC", "").strip()
    interval = DEFAULT_METRICS_INTERVAL_S
    if raw_interval:
        try:
            interval = float(raw_interval)
        except ValueError:
            raise ConfigError(f"FRNCCL_METRICS_INTERVAL_SEC must be a number of seconds, got {raw_interval[:40]!r}") from None
        if not MIN_METRICS_INTERVAL_S <= interval <= MAX_METRICS_INTERVAL_S:
            raise ConfigError(f"FRNCCL_METRICS_INTERVAL_SEC must be from {MIN_METRICS_INTERVAL_S} to {MAX_METRICS_INTERVAL_S:.0f}, got {raw_interval[:40]!r}")
    return MetricsSettings(port=port, addr=addr, textfile_dir=raw_dir or None, interval_s=interval)


DEFAULT_SLOW_WINDOW_S = 10.0
DEFAULT_SLOW_MIN_SHARE = 0.05


@dataclass(frozen=True)
class SlowSettings:
    enabled: bool
    window_s: float
    min_share: float


def _float_in(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw[:40]!r}") from None
    if not low <= value <= high:  # also refuses nan
        raise ConfigError(f"{name} must be from {low:g} to {high:g}, got {raw[:40]!r}")
    return value


def slow_settings(env: Mapping[str, str]) -> SlowSettings:
    """The slow-rank detector's settings; ConfigError (one line naming the variable) for a value that cannot be
    used. The others are read only where the detector is on."""
    if not _bool(env, "FRNCCL_SLOW_DETECT", False):
        return SlowSettings(False, DEFAULT_SLOW_WINDOW_S, DEFAULT_SLOW_MIN_SHARE)
    return SlowSettings(True, _float_in(env, "FRNCCL_SLOW_WINDOW_SEC", DEFAULT_SLOW_WINDOW_S, 1.0, 3600.0),
                        _float_in(env, "FRNCCL_SLOW_MIN_SHARE", DEFAULT_SLOW_MIN_SHARE, 0.01, 1.0))


def validate_environment(env: Mapping[str, str] | None = None) -> list[str]:
    """Every problem with the FRNCCL_* variables, one line each (used by `frnccl config`)."""
    env = os.environ if env is None else env
    problems: list[str] = list(adopted_torch_settings(env)[1])
    env = with_adopted(env)
    checks: list[Callable[[], object]] = [
        lambda: enabled(env),
        lambda: _bounded(env, "FRNCCL_BUFFER_SIZE", 0, MAX_BUFFER_SIZE),
        lambda: _choice(env, "FRNCCL_STACKS", "python", STACK_MODES),
        lambda: _dump_dir(env),
        lambda: _verdict_file(env),
        lambda: _formats(env, "FRNCCL_DUMP_FORMATS"),
        lambda: _int(env, "FRNCCL_DUMP_TIMEOUT_SEC", 60, minimum=1, maximum=MAX_SECONDS),
        lambda: _int(env, "FRNCCL_DUMP_MIN_INTERVAL_SEC", 10, maximum=MAX_SECONDS),
        lambda: _int(env, "FRNCCL_DUMP_MAX_COUNT", 100, maximum=MAX_DUMP_COUNT),
        lambda: _int(env, "FRNCCL_COORD_CHECK_MS", 1000, minimum=10, maximum=MAX_MS),
        lambda: _int(env, "FRNCCL_HEARTBEAT_TIMEOUT_SEC", 480, maximum=MAX_SECONDS),
        lambda: _int(env, "FRNCCL_WATCHDOG_POLL_MS", 100, minimum=1, maximum=MAX_MS),
        lambda: _int(env, "FRNCCL_SYMBOLIZE_TIMEOUT_MS", 2000, maximum=MAX_MS),
        lambda: _choice(env, "FRNCCL_ON_TIMEOUT", "raise", ON_TIMEOUT),
        lambda: _signal(env, "FRNCCL_DUMP_SIGNAL", 0),
        lambda: _bool(env, "FRNCCL_DUMP_ON_TEARDOWN", False),
        lambda: _int(env, "FRNCCL_DUMP_ON_TERMINATE_MS", 1000, maximum=MAX_TERMINATE_DUMP_MS),
        lambda: _int(env, "FRNCCL_DUMP_ON_EXCEPTION_MS", 3000, maximum=MAX_TERMINATE_DUMP_MS),
        lambda: _gpu_timing(env, "FRNCCL_GPU_TIMING"),
        lambda: _int(env, "FRNCCL_END_EVENT_INTERVAL_US", 0, maximum=MAX_END_EVENT_INTERVAL_US),
        lambda: _bool(env, "FRNCCL_SETTLE_BY_TORCH_WATCHDOG", True),
        lambda: job_id_from(env),
        lambda: metrics_settings(env),
        lambda: _bool(env, "FRNCCL_SLOW_DETECT", False),
        lambda: _float_in(env, "FRNCCL_SLOW_WINDOW_SEC", DEFAULT_SLOW_WINDOW_S, 1.0, 3600.0),
        lambda: _float_in(env, "FRNCCL_SLOW_MIN_SHARE", DEFAULT_SLOW_MIN_SHARE, 0.01, 1.0),
    ]
    for check in checks:
        try:
            check()
        except ConfigError as err:
            problems.append(str(err))
    if not problems:  # the pair is checked once each value parses
        try:
            FrConfig.from_env(env)
        except ConfigError as err:
            problems.append(str(err))
    return problems
