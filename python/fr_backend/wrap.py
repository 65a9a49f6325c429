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

import sys
from datetime import timedelta
from typing import Any

__all__ = ["wrap_backend", "wrap_process_group", "wrap_process_group_or_warn"]


def _timeout(value: Any) -> timedelta:
    if isinstance(value, timedelta):
        return value
    seconds = float(value)
    if seconds <= 0:
        raise ValueError(f"frnccl: timeout must be positive, got {value!r}")
    return timedelta(seconds=seconds)


def _check(rank: int, world_size: int, global_ranks: list[int] | None) -> list[int]:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"frnccl: rank {rank} is not in a group of {world_size}")
    ranks = [int(r) for r in global_ranks] if global_ranks else []
    if ranks and len(ranks) != world_size:
        raise ValueError(f"frnccl: {len(ranks)} global ranks given for a group of {world_size}")
    return ranks


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
    cannot describe a group, and ConfigError for a bad FRNCCL_* setting.
    """
    from . import _exit_note, slow
    from ._native import native
    from ._registration import _start_runtime, register
    from .config import FrConfig

    register()
    ranks = _check(int(rank), int(world_size), global_ranks)
    if backend is None and cuda_backend is None:
        raise ValueError("frnccl: wrap_backend needs a backend to forward to")
    limit = _timeout(timeout)
    config = FrConfig.from_env()
    new_life = _start_runtime(config, int(rank), int(world_size))
    if new_life:
        _exit_note.forget()
    fr = native().FrBackend(store, int(rank), int(world_size), backend, cuda_backend, str(group_name), ranks,
                            int(limit.total_seconds() * 1000), handles_failures)
    slow.note_group(store, int(rank), int(world_size), new_life)
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
        print(f"frnccl: group {group_name} not recorded ({type(err).__name__}: {str(err)[:200]}); it runs as "
              "the library built it", file=sys.stderr, flush=True)
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
