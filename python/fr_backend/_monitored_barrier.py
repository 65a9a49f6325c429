"""`dist.monitored_barrier()` on frnccl groups, for torch before 2.14.

torch 2.11-2.13 check the group's backend name in Python and refuse any but gloo
(`ValueError: monitored_barrier is only implemented for GLOO backend`), though the group's
own `monitored_barrier` method, which that function calls, works on a frnccl group: frnccl
hands it to its inner Gloo group. torch 2.14 asks for a backend registered for CPU instead,
which frnccl is, so there nothing is changed.

Before 2.14, registration puts a wrapper in place of `torch.distributed.monitored_barrier`
that does, for a frnccl group, what torch does for a gloo group, and hands every other call
to torch's function unchanged (its errors included). torch's files are not edited.
"""

from __future__ import annotations

import functools
import warnings
from datetime import timedelta
from typing import Any, Callable

BACKEND_NAME = "frnccl"
_MARK = "_frnccl_routes_monitored_barrier"
# torch's private helpers the wrapper uses, as torch's own monitored_barrier does.
_HELPERS = ("_rank_not_in_group", "_warn_not_in_group", "_get_default_timeout", "_check_valid_timeout",
            "_get_default_group", "get_backend")


def _needed(torch_version: str) -> bool:
    from torch.torch_version import TorchVersion

    return TorchVersion(torch_version) < "2.14.0.dev0"


def _frnccl_monitored_barrier(c10d: Any, group: Any, timeout: Any, wait_all_ranks: bool) -> Any:
    """torch's monitored_barrier for a gloo group (2.13's code), for a frnccl group."""
    if timeout is None:
        timeout = c10d._get_default_timeout(c10d.get_backend(group))
    elif isinstance(timeout, float):
        warnings.warn(
            "Please specify timeout arg as a timedelta. "
            f"Converting current value of {timeout} assuming it represents seconds",
            stacklevel=3,
        )
        timeout = timedelta(seconds=timeout)
    c10d._check_valid_timeout(timeout)
    group_to_use = c10d._get_default_group() if group is None else group
    return group_to_use.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def _is_frnccl(c10d: Any, group: Any) -> bool:
    if c10d._rank_not_in_group(group):
        return False  # torch's function warns and returns
    if group is None and not c10d.is_initialized():
        return False  # torch's function names the missing default group
    try:
        return str(c10d.get_backend(group)) == BACKEND_NAME
    except (ValueError, RuntimeError):
        return False  # not a group torch knows: its own function says so


def _wrap(c10d: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> Any:
        if _is_frnccl(c10d, group):
            return _frnccl_monitored_barrier(c10d, group, timeout, wait_all_ranks)
        return original(group, timeout, wait_all_ranks)

    setattr(monitored_barrier, _MARK, True)
    return monitored_barrier


def route(torch_version: str) -> bool:
    """Puts the wrapper in place where torch needs it (idempotent); returns whether it is in place."""
    if not _needed(torch_version):
        return False
    import torch.distributed as dist

    if not dist.is_available():
        return False
    from torch.distributed import distributed_c10d as c10d

    original = getattr(c10d, "monitored_barrier", None)
    if original is None or not all(hasattr(c10d, h) for h in _HELPERS):
        return False  # a torch unlike 2.11-2.13: leave its function alone
    if getattr(original, _MARK, False):
        return True
    wrapper = _wrap(c10d, original)
    c10d.monitored_barrier = wrapper
    if getattr(dist, "monitored_barrier", None) is original:
        dist.monitored_barrier = wrapper
    return True
