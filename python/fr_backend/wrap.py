"""A public way to make a group that a library builds itself a frnccl group.

Libraries such as torchft build torch's inner backends directly (`ProcessGroupGloo(store, rank, size, timeout)`)
instead of going through `init_process_group`/`new_group`, so neither `backend="frnccl"` nor FRNCCL_ENABLE
reaches them. `wrap_backend` puts a FrBackend in front of such a backend: every op is forwarded to it unchanged
and recorded, and the group takes part in a frnccl life (recorder, watchdog, monitor) like any other.
`wrap_process_group` does the same for every device of a torch ProcessGroup the library assembled, in place.

The first wrapped group made while no frnccl group is alive starts a new life with the rank and world size given
here; its monitor coordinates through the root of `store` (the TCPStore under any PrefixStore), as every frnccl
group's does. A later group made while one is alive joins that life.
"""

from __future__ import annotations

import math
import operator
import sys
from datetime import timedelta
from typing import Any

__all__ = ["wrap_backend", "wrap_process_group", "wrap_process_group_or_warn"]


def _shown(value: Any) -> str:
    """A value as an error line shows it: one line, short; an object by its type only."""
    if value is None or isinstance(value, (bool, int, float, str, timedelta)):
        text = repr(value)
        return text if len(text) <= 60 and "\n" not in text else text[:60].replace("\n", " ") + "..."
    return f"a {type(value).__name__}"


def _integer(name: str, value: Any) -> int:
    # operator.index takes what is an integer (numpy's too) and nothing that only converts to one: 0.5 or
    # "0" would otherwise become a rank silently.
    if isinstance(value, bool):
        raise TypeError(f"frnccl: {name} must be an integer, got {_shown(value)}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"frnccl: {name} must be an integer, got {_shown(value)}") from None


def _timeout(value: Any) -> timedelta:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"frnccl: timeout must be a timedelta or a number of seconds, got {_shown(value)}")
    # The watchdog counts whole milliseconds: less than one would time every op out at once.
    if not math.isfinite(seconds) or seconds < 0.001 or seconds > timedelta.max.total_seconds():
        raise ValueError(f"frnccl: timeout must be a finite duration of at least 1 ms, got {_shown(value)}")
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)


def _check(rank: Any, world_size: Any, global_ranks: Any) -> tuple[int, int, list[int]]:
    size = _integer("world_size", world_size)
    if size < 1:
        raise ValueError(f"frnccl: world_size must be at least 1, got {size}")
    me = _integer("rank", rank)
    if not 0 <= me < size:
        raise ValueError(f"frnccl: rank {me} is not in a group of world_size {size}")
    if not global_ranks:
        return me, size, []
    if isinstance(global_ranks, (str, bytes)) or not hasattr(global_ranks, "__iter__"):
        raise TypeError(f"frnccl: global_ranks must be a list of integers, got {_shown(global_ranks)}")
    ranks = [_integer("global_ranks", r) for r in global_ranks]
    if len(ranks) != size:
        raise ValueError(f"frnccl: {len(ranks)} global_ranks given for a group of world_size {size}")
    if min(ranks) < 0 or len(set(ranks)) != len(ranks):
        raise ValueError(f"frnccl: global_ranks must be distinct and not negative, got {ranks[:8]}")
    return me, size, ranks


def _check_backend(name: str, value: Any) -> None:
    from torch._C._distributed_c10d import Backend, ProcessGroup

    if value is None or isinstance(value, Backend):
        return
    hint = " (a ProcessGroup is wrapped with wrap_process_group)" if isinstance(value, ProcessGroup) else ""
    raise TypeError(f"frnccl: {name} must be a torch c10d Backend such as ProcessGroupGloo, got "
                    f"{_shown(value)}{hint}")


def _check_store(store: Any) -> None:
    from torch._C._distributed_c10d import Store

    if not isinstance(store, Store):
        raise TypeError(f"frnccl: store must be a torch.distributed Store, got {_shown(store)}")


def _check_name(group_name: Any) -> str:
    if not isinstance(group_name, str):
        raise TypeError(f"frnccl: group_name must be a string, got {_shown(group_name)}")
    if not group_name:
        raise ValueError("frnccl: group_name must not be empty (dumps match groups by it)")
    return group_name


def wrap_backend(backend: Any, store: Any, rank: int, world_size: int, *, group_name: str,
                 timeout: timedelta | float, global_ranks: list[int] | None = None,
                 cuda_backend: Any = None, handles_failures: bool = False) -> Any:
    """A frnccl backend forwarding to `backend` (a torch c10d Backend the caller built over `store`).

    `backend` serves CPU tensors and, where `cuda_backend` is None, nothing else; `cuda_backend` (e.g. the
    library's ProcessGroupNCCL, or the same Gloo backend) serves CUDA tensors. `rank`/`world_size` are this
    process's place in the group; `group_name` must be the same on every member (dumps match groups by it);
    `timeout` is the group's, which frnccl's watchdog times ops against. `handles_failures`: the library
    handles this group's failures itself (torchft: a replica dies, the step is dropped, the next quorum
    rebuilds the group), so a failed or timed-out op is recorded but opens no incident (no job-wide dump, no
    verdict, no abort, no FRNCCL_ON_TIMEOUT=exit); the library sees the op's error as without frnccl. Raises ValueError for arguments that
    cannot describe a group, TypeError for one of the wrong kind (each one line naming it; nothing is started
    then), and ConfigError for a bad FRNCCL_* setting.
    """
    from . import _exit_note, slow
    from ._native import native
    from ._registration import start_runtime, register
    from .config import FrConfig

    # Every argument is checked before anything starts: a bad call leaves no life behind.
    rank, world_size, ranks = _check(rank, world_size, global_ranks)
    _check_store(store)
    _check_backend("backend", backend)
    _check_backend("cuda_backend", cuda_backend)
    if backend is None and cuda_backend is None:
        raise ValueError("frnccl: wrap_backend needs a backend to forward to (backend and cuda_backend are None)")
    limit = _timeout(timeout)
    name = _check_name(group_name)
    config = FrConfig.from_env()
    register()
    new_life = start_runtime(config, rank, world_size)
    if new_life:
        _exit_note.forget()
    fr = native().FrBackend(store, rank, world_size, backend, cuda_backend, name, ranks,
                            max(1, int(limit.total_seconds() * 1000)), handles_failures)
    slow.note_group(store, rank, world_size, new_life)
    return fr


def wrap_process_group(pg: Any, store: Any, rank: int | None = None, world_size: int | None = None, *,
                       group_name: str, timeout: timedelta | float, global_ranks: list[int] | None = None,
                       handles_failures: bool = False) -> Any:
    """Makes `pg` (a torch ProcessGroup a library assembled from its own backends) a frnccl group, in place.

    Each device's op then goes through one FrBackend forwarding to the backend the library registered for it;
    the library's backends stay registered under their own types (torch's C++ casts a group's GLOO backend to
    its own ProcessGroupGloo), so `pg._get_backend(device)` answers frnccl's backend, and the group's default
    backend and name are unchanged. Returns `pg`.
    """
    import torch
    from torch.distributed import ProcessGroup

    if not isinstance(pg, ProcessGroup):
        raise TypeError(f"frnccl: pg must be a torch ProcessGroup, got {_shown(pg)}")
    rank = pg.rank() if rank is None else rank
    world_size = pg.size() if world_size is None else world_size
    devices = _backends_by_device(pg)
    cpu = devices.get("cpu")
    cuda = devices.get("cuda")
    if cpu is None and cuda is None:
        raise ValueError("frnccl: the group has no CPU or CUDA backend to wrap")
    if any(b.name() == "frnccl" for b in devices.values()):
        return pg  # already a frnccl group: a second FrBackend would record every op twice
    fr = wrap_backend(cpu, store, rank, world_size, group_name=group_name, timeout=timeout,
                      global_ranks=global_ranks, cuda_backend=cuda, handles_failures=handles_failures)
    custom = ProcessGroup.BackendType.CUSTOM
    for device in devices:
        pg._register_backend(torch.device(device), custom, fr)
    return pg


def wrap_process_group_or_warn(pg: Any, store: Any, rank: int | None = None, world_size: int | None = None, *,
                               group_name: str, timeout: timedelta | float,
                               global_ranks: list[int] | None = None, handles_failures: bool = False) -> Any:
    """wrap_process_group for integrations, which must never end a job plain torch would have run: a failure
    is one line on stderr, and `pg` is returned as the library built it."""
    try:
        return wrap_process_group(pg, store, rank, world_size, group_name=group_name, timeout=timeout,
                                  global_ranks=global_ranks, handles_failures=handles_failures)
    except Exception as err:  # noqa: BLE001 - the library's own group runs on without frnccl
        # One line whatever the error holds (a C++ error's text may run over several).
        why = " ".join(str(err).split())[:200]
        print(f"frnccl: group {_shown(group_name)} not recorded ({type(err).__name__}: {why}); it runs as the "
              "library built it", file=sys.stderr, flush=True)
        return pg


def _backends_by_device(pg: Any) -> dict[str, Any]:
    """device type -> the backend `pg` sends that device's tensors to (only devices frnccl serves)."""
    import torch

    found: dict[str, Any] = {}
    for device in ("cpu", "cuda"):
        try:
            found[device] = pg._get_backend(torch.device(device))
        except RuntimeError:  # torch: no backend registered for this device
            continue
    return found
