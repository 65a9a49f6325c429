"""Registers the `frnccl` backend and creates its groups.

The creator builds the real inner backends (Gloo for CPU tensors, NCCL for CUDA
tensors) over the group's store, and wraps them in the C++ FrBackend.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import functools
import os
import socket
import sys
import threading
import warnings
from datetime import timedelta
from typing import Any, Iterator

from . import _exit_note, metrics, slow
from .config import ConfigError, FrConfig, adopted_torch_settings, dump_signal, enabled, stacks_signal

BACKEND_NAME = "frnccl"

# Re-entrant: `import fr_backend` imports torch, whose entry point calls
# register() again on the same thread.
_state_lock = threading.RLock()
_registered = False
# Set up once per process, whatever its lives (see start_runtime).
_process_set_up = False
# Kept open for the life of the process: faulthandler writes thread stacks here.
_stacks_fd: int | None = None
_stacks_signal = 0


def register() -> None:
    """Register `frnccl` with torch.distributed (idempotent; loads no native code)."""
    global _registered
    with _state_lock:
        if _registered:
            return
        import torch.distributed as dist

        if _registered:  # done by the entry point during the import above
            return
        if BACKEND_NAME.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(
                BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"]
            )
        _registered = True
        _declare_self_recording()
        _route_monitored_barrier()
        _enable_if_asked()


def _say(line: str) -> None:
    """One line on stderr: FRNCCL_ENABLE is read inside `import torch`, where a warning's two lines would
    point into torch."""
    print(f"frnccl: {line}", file=sys.stderr, flush=True)


def _enable_if_asked() -> None:
    """FRNCCL_ENABLE=1: groups on gloo or nccl are made through frnccl (see _enable). Any other value than
    0/1 is one line, and the job runs as if it were unset."""
    try:
        if not enabled():
            return
    except ConfigError as err:
        _say(f"{err}; ignored: frnccl stays off, as if it were unset")
        return
    from ._enable import install

    try:
        if not install():
            _say("FRNCCL_ENABLE=1 ignored: this torch lacks the group-creation helper frnccl wraps")
            return
    except Exception as err:  # torch runs on as without frnccl
        _say(f"FRNCCL_ENABLE=1 ignored ({type(err).__name__}: {err})")
        return
    _handle_dump_signal_before_any_group()


def _handle_dump_signal_before_any_group() -> None:
    """Under FRNCCL_ENABLE the README's `kill -USR1 <any rank>` may reach a rank before its first group (or
    one that makes none): without frnccl's handler the signal's default action would end it. Installed now,
    the handler says in one line that there is nothing to dump, and the process goes on. A bad
    FRNCCL_DUMP_SIGNAL is left for the first group to report."""
    try:
        number = dump_signal()
    except ConfigError:
        return
    if number <= 0:
        return
    try:
        from ._native import native

        native().install_dump_signal(number)
        _follow_python_signal_handlers()
    except Exception as err:  # the job runs on; the handler comes with the first group
        _say(f"the dump signal is handled from the first group on ({type(err).__name__}: {err})")


def _follow_python_signal_handlers() -> None:
    from ._native import native
    from ._signals import follow_python_handlers

    follow_python_handlers(native())


def _declare_self_recording() -> None:
    """Tells torch (2.15 and later) that frnccl groups record themselves.

    torch attaches its own hook-based flight recorder to every group whose backends it does not know
    to record themselves (`_FR_SELF_RECORDING_BACKENDS`); on a frnccl group that records every op a
    second time, at torch's cost, and torch's recorder acts on aborts by itself. Earlier versions
    have no such set and no such hook.
    """
    from torch.distributed import distributed_c10d

    self_recording = getattr(distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
    if isinstance(self_recording, set):
        self_recording.add(BACKEND_NAME)


def _route_monitored_barrier() -> None:
    """Lets `dist.monitored_barrier()` take frnccl groups where torch's own check refuses them (before 2.14)."""
    from ._monitored_barrier import route

    try:
        route(_torch_version())
    except Exception as err:  # the backend works without it; the call then raises torch's ValueError
        warnings.warn(f"frnccl: dist.monitored_barrier() not routed to frnccl groups ({type(err).__name__}: {err})",
                      RuntimeWarning, stacklevel=3)


def _route_pg_timeout() -> None:
    """Lets `_set_pg_timeout` (torchtitan's set_pg_timeouts, and others) change frnccl groups' timeouts where
    torch's function passes them by (before 2.15)."""
    from ._pg_timeout import route

    try:
        route()
    except Exception as err:  # the backend works without it; the call then warns as torch's does
        warnings.warn(f"frnccl: _set_pg_timeout() not routed to frnccl groups ({type(err).__name__}: {err})",
                      RuntimeWarning, stacklevel=3)


_registration_error: str | None = None


def register_or_warn() -> None:
    """register(), for imports that must never fail (the `torch.backends` entry point runs inside
    `import torch`, and it imports this package): a failure is one warning, and later calls stay quiet."""
    global _registration_error
    if _registration_error is not None:
        return
    try:
        register()
    except Exception as err:
        _registration_error = f"{type(err).__name__}: {err}"
        warnings.warn(f"frnccl: backend not registered ({_registration_error})", RuntimeWarning, stacklevel=3)


def _world_rank_and_size(group_rank: int, group_size: int, global_ranks: list[int]) -> tuple[int, int]:
    import torch.distributed as dist

    rank = global_ranks[group_rank] if global_ranks else group_rank
    if dist.is_initialized():
        return rank, dist.get_world_size()
    if not global_ranks:
        return rank, group_size
    return rank, int(os.environ.get("WORLD_SIZE", group_size))


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


@functools.lru_cache(maxsize=1)
def _frnccl_version() -> str:
    try:
        from importlib.metadata import version

        return version("frnccl")
    except Exception:
        return "unknown"


def _set_up_process() -> int:
    """What a process sets up once, whatever its lives: faulthandler's file for thread stacks, the exit hook.
    Returns the signal faulthandler answers (0: none)."""
    global _process_set_up, _stacks_fd, _stacks_signal
    if _process_set_up:
        return _stacks_signal
    from ._native import native

    for problem in adopted_torch_settings()[1]:  # said once per process, not once per group
        _say(problem)
    signal_for_stacks = stacks_signal()
    if signal_for_stacks > 0 and hasattr(os, "memfd_create"):
        try:
            _stacks_fd = os.memfd_create("frnccl-thread-stacks")
            faulthandler.register(signal_for_stacks, file=_stacks_fd, all_threads=True, chain=False)
        except (OSError, RuntimeError, ValueError):
            signal_for_stacks = 0
    else:
        signal_for_stacks = 0
    _stacks_signal = signal_for_stacks
    # The SIGTERM, SIGABRT and dump-signal handlers come with the first group; signal.signal calls after
    # that (Lightning's, when fit starts) must not take their place.
    _follow_python_signal_handlers()
    _route_pg_timeout()  # with the first group: a process that makes none keeps torch's function as it is
    # At exit: report failures Python already saw and let a running dump
    # finish (bounded) before the interpreter goes away; a rank leaving with
    # an uncaught exception writes its part first, saying why.
    _exit_note.install()
    atexit.register(_at_exit)
    _process_set_up = True
    return _stacks_signal


def _at_exit() -> None:
    from ._native import native

    try:
        _exit_note.note_if_missed()
        _exit_note.confirm_at_exit()
        native().at_exit()
        # Before the threads stop: a SIGTERM from the launcher (torchrun stops the other workers as soon as one
        # failed) still writes the verdict into the error file while this is being written.
        _exit_note.after_exit()
    finally:
        # Whatever happened above: no frnccl thread may run on into the interpreter's finalization.
        native().stop_at_exit()


def _attempt() -> int:
    """The launcher's restart count; a value that is not a count is said once and taken as 0."""
    for name in ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"):
        raw = os.environ.get(name)
        if raw is None:
            continue
        try:
            return max(int(raw or 0), 0)
        except ValueError:
            warnings.warn(f"frnccl: {name}={raw[:40]!r} is not a restart count; dumps record attempt 0",
                          RuntimeWarning, stacklevel=4)
            return 0
    return 0


def start_runtime(config: FrConfig, rank: int, world_size: int) -> bool:
    """Hands the C++ side this group's configuration, before the group is created.

    It takes it when no frnccl group is alive: a new life of the process begins (the first group, or the first
    after destroy_process_group, as torchft and in-process restarts do), with this rank, world size and attempt.
    Otherwise the group joins the life in progress. Returns whether a new life began.
    """
    from ._native import native

    signal_for_stacks = _set_up_process()
    raw_local_rank = os.environ.get("LOCAL_RANK", "")
    local_rank = int(raw_local_rank) if raw_local_rank.isascii() and raw_local_rank.isdigit() else -1  # dumps say -1 for none or a bad value
    new_life = bool(native().configure(
        {
            "buffer_size": config.buffer_size,
            "stacks": config.stacks,
            "dump_dir": config.dump_dir,
            "verdict_file": config.verdict_file,
            "write_compact": "compact" in config.formats,
            "write_pickle": "pickle" in config.formats,
            "write_json": "json" in config.formats,
            "write_chrome": "chrome" in config.formats,
            "coord_check_ms": config.coord_check_ms,
            "heartbeat_timeout_ms": config.heartbeat_timeout_ms,
            "dump_timeout_ms": config.dump_timeout_ms,
            "dump_min_interval_ms": config.dump_min_interval_ms,
            "dump_max_count": config.dump_max_count,
            "watchdog_poll_ms": config.watchdog_poll_ms,
            "symbolize_timeout_ms": config.symbolize_timeout_ms,
            "on_timeout": config.on_timeout,
            "dump_signal": config.dump_signal,
            "stacks_signal": signal_for_stacks,
            "stacks_fd": _stacks_fd if _stacks_fd is not None else -1,
            "dump_on_teardown": config.dump_on_teardown,
            "terminate_dump_ms": config.terminate_dump_ms,
            "exception_exit_ms": config.exception_exit_ms,
            "gpu_timing_every": config.gpu_timing_every,
            "end_event_interval_us": config.end_event_interval_us,
            "settle_by_torch_watchdog": config.settle_by_torch_watchdog,
            "rank": rank,
            "local_rank": local_rank,
            "world_size": world_size,
            "hostname": socket.gethostname(),
            "job_id": config.job_id,
            "attempt": _attempt(),
            "torch_version": _torch_version(),
            "frnccl_version": _frnccl_version(),
        }
    ))
    if new_life:
        metrics.note_life(rank, world_size, config.job_id)
    return new_life


def _enabled_by_env() -> bool:
    from ._enable import active

    return active()


@contextlib.contextmanager
def _torch_recorder_off() -> Iterator[bool]:
    """Keeps torch's own flight recorder (and NCCL's heartbeat monitor) out of an inner group.

    Recording twice costs NCCL a few microseconds per small op, and Gloo a Python
    stack capture per op. torch reads the buffer size once per process, when its
    recorder is first used, so this only holds when an frnccl group is the first
    group of its kind in the process (see docs/configuration.md); a size the user
    set is left alone. Yields whether the buffer size was set to 0 here.
    """
    keys = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_ENABLE_MONITORING", "TORCH_NCCL_DUMP_ON_TIMEOUT")
    saved = {k: os.environ.get(k) for k in keys}
    overrides = {"TORCH_NCCL_ENABLE_MONITORING": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    if saved["TORCH_FR_BUFFER_SIZE"] is None and saved["TORCH_NCCL_TRACE_BUFFER_SIZE"] is None:
        overrides["TORCH_FR_BUFFER_SIZE"] = "0"  # the older name only earns a deprecation warning
    elif _enabled_by_env():
        # Under FRNCCL_ENABLE the size set for torch's recorder is frnccl's (config.adopted_torch_settings),
        # and every gloo/nccl group is frnccl's: torch's recorder would only record the same ops again.
        overrides["TORCH_FR_BUFFER_SIZE"] = "0"
        if saved["TORCH_NCCL_TRACE_BUFFER_SIZE"] is not None:
            overrides["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "0"
    os.environ.update(overrides)
    try:
        yield "TORCH_FR_BUFFER_SIZE" in overrides
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _agree_on_sequence_number(inner: Any) -> None:
    """Does for an inner backend what torch does for its own gloo and nccl groups, and never for plugins.

    From torch 2.14 every rank starts at 0 and the call is a no-op that prints a deprecation
    warning into every frnccl process, so it is made only where it still agrees on something.
    """
    from torch.torch_version import TorchVersion

    if TorchVersion(_torch_version()) < "2.14.0.dev0":
        inner._set_sequence_number_for_group()


def _gloo_devices(gloo_class: Any) -> list[Any]:
    """The transport devices torch's own gloo groups use: one per interface named in GLOO_SOCKET_IFNAME,
    else the default one. TORCH_GLOO_LAZY_INIT is read by torch itself (lazy_init left unset)."""
    interfaces = os.environ.get("GLOO_SOCKET_IFNAME", "")
    if len(interfaces) > 1:  # torch's own test: a one-character value names nothing
        return [gloo_class.create_device(interface=name) for name in interfaces.split(",")]
    return [gloo_class.create_default_device()]


def _make_gloo(store: Any, rank: int, size: int, timeout: timedelta, group_name: str, global_ranks: list[int]) -> Any:
    from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo

    options = ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = _gloo_devices(ProcessGroupGloo)
    options._threads = 2 * len(options._devices)  # as torch sizes its own gloo groups
    options.global_ranks_in_group = global_ranks
    options.group_name = group_name
    with _torch_recorder_off():
        gloo = ProcessGroupGloo(PrefixStore("gloo/", store), rank, size, options)
    _agree_on_sequence_number(gloo)
    return gloo


def inner_nccl_kind() -> str:
    """Which NCCL backend frnccl wraps: the one torch's own `"nccl"` builds in this process.

    "nccl2" (`ProcessGroupNCCL2`) where torch has it and has not been told otherwise
    (`TORCH_DIST_USE_NCCL2=0`, or "nccl" registered as the legacy backend); "nccl"
    (`ProcessGroupNCCL`) before torch 2.15 and where the legacy backend is chosen.
    """
    import torch.distributed as dist

    try:
        from torch._C._distributed_c10d import ProcessGroupNCCL2  # noqa: F401
    except ImportError:
        return "nccl"
    plugin = getattr(dist.Backend, "_plugins", {}).get("NCCL")
    creator = getattr(getattr(plugin, "creator_fn", None), "__name__", "")
    if creator == "_create_nccl_process_group":
        return "nccl"
    if creator == "_create_nccl2_process_group":
        return "nccl2"
    # torch registers "nccl" lazily, at its first use, by the same rule.
    return "nccl" if os.environ.get("TORCH_DIST_USE_NCCL2") == "0" else "nccl2"


def _nccl2_device(dist_opts: Any, rank: int) -> Any:
    """The device a nccl2 communicator is made on, chosen as torch chooses it for its own nccl2 groups:
    the group's bound device, else LOCAL_RANK's (or the global rank's) share of the visible GPUs."""
    import torch

    group = getattr(dist_opts, "process_group", None)
    bound = getattr(group, "bound_device_id", None) if group is not None else None
    if bound is not None:
        return bound
    count = torch.cuda.device_count()
    local_rank = os.environ.get("LOCAL_RANK", "")
    index = int(local_rank) if local_rank.isascii() and local_rank.isdigit() else rank
    return torch.device("cuda", index % count)


def _make_nccl(
    store: Any, rank: int, size: int, timeout: timedelta, group_name: str, global_ranks: list[int], dump_timeout_ms: int,
    kind: str = "nccl", device: Any = None,
) -> Any:
    from torch._C import _distributed_c10d as c10d
    from torch._C._distributed_c10d import PrefixStore, ProcessGroupNCCL

    options = ProcessGroupNCCL.Options()
    # NCCL's own watchdog would tear the process down at the same timeout
    # ours fires at, before the job-wide dump is written. frnccl watches the
    # group's timeout itself and aborts the communicator after the dump, so
    # NCCL only gets a backstop later than that.
    options._timeout = timeout + timedelta(milliseconds=dump_timeout_ms) + timedelta(seconds=30)
    options.global_ranks_in_group = global_ranks
    options.group_name = group_name
    if kind == "nccl2":
        # nccl2 keeps no recorder of its own (torch records it through a hook on its ProcessGroup, which an
        # inner backend does not have) and its watchdog runs on the same backstop timeout.
        with _torch_recorder_off():
            nccl = c10d.ProcessGroupNCCL2(PrefixStore("nccl/", store), rank, size, options, device)
        return nccl
    with _torch_recorder_off() as buffer_size_zeroed:
        if buffer_size_zeroed and not _process_has_plain_nccl_group():
            _settle_torch_nccl_recorder()
        nccl = ProcessGroupNCCL(PrefixStore("nccl/", store), rank, size, options)
    _agree_on_sequence_number(nccl)
    return nccl


def _process_has_plain_nccl_group() -> bool:
    """Whether a group of the process already runs CUDA tensors on torch's own NCCL backend.

    Its user expects torch's recorder on, so frnccl must not be the one to size it.
    When that cannot be told, the answer is yes: recording twice costs time, while
    switching off a recorder someone relies on loses their data.
    """
    try:
        import torch
        from torch._C._distributed_c10d import ProcessGroupNCCL
        from torch.distributed import distributed_c10d

        cuda = torch.device("cuda")
        for group in list(distributed_c10d._world.pg_map):
            try:
                backend = group._get_backend(cuda)
            except Exception:  # no CUDA backend in this group
                continue
            if isinstance(backend, ProcessGroupNCCL):
                return True
        return False
    except Exception:
        return True


def _settle_torch_nccl_recorder() -> None:
    """Makes torch create its NCCL flight recorder now, while the buffer size reads 0.

    torch's NCCL recorder is a process-wide singleton that reads TORCH_FR_BUFFER_SIZE
    when it is first used. On torch 2.11 that is the group's first op or torch's
    watchdog thread, after _torch_recorder_off has put the environment back, so
    without this it comes up at its default size and records frnccl's inner group
    as well. An empty dump (no collectives, no stacks) is the cheapest first use
    torch offers from Python. Best effort: a torch without it records twice.
    """
    from torch._C import _distributed_c10d

    dump = getattr(_distributed_c10d, "_dump_nccl_trace", None)
    if dump is None:
        return
    with contextlib.suppress(Exception):
        dump(False, False, True)


def _planned_devices() -> dict[str, str] | None:
    from ._enable import planned_devices

    return planned_devices()


def _create_backend(dist_opts: Any, backend_opts: Any) -> Any:
    import torch

    config = FrConfig.from_env()
    if backend_opts is not None:
        warnings.warn(
            f"frnccl: pg_options ({type(backend_opts).__name__}) are not used: frnccl builds its inner Gloo and NCCL "
            "groups from the group's timeout and torch's environment variables",
            stacklevel=2,
        )
    store = dist_opts.store
    group_rank = int(dist_opts.group_rank)
    group_size = int(dist_opts.group_size)
    timeout = dist_opts.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    group_name = str(dist_opts.group_id)
    global_ranks = [int(r) for r in dist_opts.global_ranks_in_group]
    rank, world_size = _world_rank_and_size(group_rank, group_size, global_ranks)
    new_life = start_runtime(config, rank, world_size)
    if new_life:
        _exit_note.forget()

    from ._native import native

    C = native()
    gloo = _make_gloo(store, group_rank, group_size, timeout, group_name, global_ranks)
    nccl = None
    planned = _planned_devices()
    if planned is not None and "nccl" not in planned.values():
        # FRNCCL_ENABLE on a group the code put on gloo: Gloo serves its CUDA tensors too, as without frnccl.
        if "cuda" in planned:
            nccl = gloo
    elif torch.cuda.is_available() and torch.distributed.is_nccl_available():
        kind = inner_nccl_kind()
        device = _nccl2_device(dist_opts, rank) if kind == "nccl2" else None
        nccl = _make_nccl(store, group_rank, group_size, timeout, group_name, global_ranks, config.dump_timeout_ms,
                          kind, device)
    backend = C.FrBackend(
        store,
        group_rank,
        group_size,
        gloo,
        nccl,
        group_name,
        global_ranks,
        int(timeout.total_seconds() * 1000),
    )
    # After the group attached: its life is alive when the detector gets the store, so that the detector
    # can tell a life that ended (and let go of the store) from one not begun.
    slow.note_group(store, rank, world_size, new_life)
    return backend
