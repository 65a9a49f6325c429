"""`_set_pg_timeout(timeout, group)` on frnccl groups, for torch whose function picks backends by class.

Stacks change a group's timeout after it is made: torchtitan's set_pg_timeouts calls
`torch.distributed.distributed_c10d._set_pg_timeout` on every DeviceMesh group and the default group after its
first step. Up to torch 2.14 that function changes only backends that are `ProcessGroupGloo` or
`ProcessGroupNCCL` instances; a FrBackend is neither, so the timeout stayed as it was (a hang then waited
the default 30 min) and torch warned "Set timeout is now only supported for either nccl or gloo". From torch
2.15 it calls `ProcessGroup.set_timeout`, which reaches every backend, so nothing is changed there.

Where needed, registration puts a wrapper in place of the function: it sets the timeout of each frnccl
backend of the group (FrBackend.setTimeout: frnccl's watchdog and its inner Gloo and NCCL groups), and hands
the call to torch's function for everything else, its errors and warnings included. torch's files are not
edited.
"""

from __future__ import annotations

import functools
import inspect
from datetime import timedelta
from typing import Any, Callable

BACKEND_NAME = "frnccl"
_MARK = "_frnccl_routes_set_pg_timeout"
_FUNCTIONS = ("_set_pg_timeout", "set_timeout")
# A function that names these classes picks the backends it changes by class, and passes a FrBackend by.
_CLASS_CHECKS = {"ProcessGroupGloo", "ProcessGroupNCCL"}


def _picks_by_class(function: Callable[..., Any]) -> bool:
    code = getattr(inspect.unwrap(function), "__code__", None)
    return code is not None and bool(_CLASS_CHECKS & set(code.co_names))


def _group_backends(c10d: Any, group: Any) -> list[Any]:
    """The distinct backends of the group's devices; none where torch's own function must decide (no default
    group, a rank outside the group, not a ProcessGroup: it raises or warns as it does)."""
    import torch

    if group is None:
        if not c10d.is_initialized():
            return []
        group = c10d._get_default_group()
    if not isinstance(group, c10d.ProcessGroup) or c10d._rank_not_in_group(group):
        return []
    backends: list[Any] = []
    for device in group._device_types:
        try:
            backend = group._get_backend(torch.device(device.type))
        except RuntimeError:
            continue
        if all(backend is not seen for seen in backends):
            backends.append(backend)
    return backends


def _is_frnccl(backend: Any) -> bool:
    try:
        return str(backend.name()) == BACKEND_NAME
    except Exception:
        return False


def _wrap(c10d: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def set_pg_timeout(timeout: timedelta, group: Any = None) -> None:
        backends = _group_backends(c10d, group)
        frnccl = [backend for backend in backends if _is_frnccl(backend)]
        if not frnccl:
            return original(timeout, group)
        for backend in frnccl:
            backend._set_default_timeout(timeout)
        if len(frnccl) < len(backends):  # a group whose other devices are on torch's own backends
            return original(timeout, group)
        return None

    setattr(set_pg_timeout, _MARK, True)
    return set_pg_timeout


def route() -> list[str]:
    """Puts a wrapper in place of each timeout setter of this torch that picks backends by class
    (idempotent); returns the names of the functions wrapped now or before."""
    import torch.distributed as dist

    if not dist.is_available():
        return []
    from torch.distributed import distributed_c10d as c10d

    if not all(hasattr(c10d, helper) for helper in ("_rank_not_in_group", "_get_default_group", "ProcessGroup")):
        return []  # a torch unlike 2.11-2.15: leave its functions alone
    routed = []
    for name in _FUNCTIONS:
        original = getattr(c10d, name, None)
        if original is None:
            continue
        if getattr(original, _MARK, False):
            routed.append(name)
            continue
        if not _picks_by_class(original):
            continue
        wrapper = _wrap(c10d, original)
        setattr(c10d, name, wrapper)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapper)
        routed.append(name)
    return routed
