"""FRNCCL_ENABLE=1: every group a job creates on gloo or nccl is created through frnccl, under torch's own names.

Training stacks name "nccl" or "gloo" (or nothing); their code is not edited. At `import torch` the entry
point puts a wrapper in place of torch's group-creation helper (`_new_process_group_helper`, which
`init_process_group`, `new_group`, `new_subgroups` and `init_device_mesh` all go through). For a group whose
every device maps to gloo or nccl, the wrapper asks torch for the same group on frnccl (only on the devices
the caller's backend covers), then gives it back the names plain torch gives it: the FrBackend is registered
under the GLOO or NCCL backend type of each device, the group's default type is the one torch would pick, and
`_world.pg_map` / `pg_backend_config` hold the caller's own backend string. `dist.get_backend()`,
`pg._get_backend_name()` and every library branching on them see "gloo"/"nccl" as without frnccl.

Python code in torch that needs torch's own classes checks `isinstance(..., ProcessGroupNCCL)`, which a
FrBackend is not, so those paths take their non-NCCL branch (documented in docs/usage.md). Unset or 0:
nothing here runs and no torch function is replaced.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

BACKEND_NAME = "frnccl"
IMPERSONATED = ("gloo", "nccl")
_MARK = "_frnccl_enable_wrapper"

# Group names of the groups made here: split_group's fallback needs to tell them from other groups.
_groups_lock = threading.Lock()
_frnccl_group_names: set[str] = set()
_split_note_given = False
# The plan of the group this thread is creating, for frnccl's creator (planned_devices): torch calls the
# creator from inside its helper, with nothing of the caller's backend string.
_creating = threading.local()


@dataclass(frozen=True)
class Plan:
    """How one group request is turned into an frnccl group."""

    original: Any  # the backend as the caller gave it: what torch records in pg_map
    devices: dict[str, str]  # device type -> gloo or nccl, as torch would map the original
    spec: str  # what torch is asked for instead: frnccl on exactly those devices


def plan_for(backend: Any) -> Plan | None:
    """A plan when every device of `backend` maps to gloo or nccl; None leaves the request to torch as is."""
    from torch.distributed import distributed_c10d as c10d
    from torch.distributed.distributed_c10d import Backend, BackendConfig

    try:
        config = BackendConfig(Backend(str(backend) if backend is not None else "undefined"))
        devices = {str(d): str(b) for d, b in config.get_device_backend_map().items()}
    except Exception:  # torch's own call raises its own error for this backend
        return None
    if not devices or any(name not in IMPERSONATED for name in devices.values()):
        return None
    if "nccl" in devices.values() and not c10d.is_nccl_available():
        return None  # torch refuses the group itself ("doesn't have NCCL built in"), as it would without frnccl
    return Plan(backend, devices, ",".join(f"{device}:{BACKEND_NAME}" for device in devices))


def default_backend_type(plan: Plan, device_id: Any) -> Any:
    """The default backend type torch gives a group made with `plan.original` (None: torch sets none)."""
    from torch.distributed import distributed_c10d as c10d

    ProcessGroup = c10d.ProcessGroup
    original = str(plan.original) if plan.original is not None else "undefined"
    config = c10d.BackendConfig(c10d.Backend(original))
    resolve = getattr(c10d, "_get_default_backend_type_for_backend_config", None)
    if resolve is not None:  # torch 2.14 and later
        return resolve(config, device_id)
    # torch 2.11-2.13, as _new_process_group_helper decides it.
    values = set(plan.devices.values())
    if "," not in original and ":" not in original:
        if original == c10d.Backend.UNDEFINED:
            return ProcessGroup.BackendType.NCCL if "nccl" in values else ProcessGroup.BackendType.GLOO
        return c10d.Backend.backend_type_map[original]
    if "nccl" in values:
        return ProcessGroup.BackendType.NCCL
    if c10d.Backend._plugins:
        return None  # torch looks for a plugin among the values, finds none, and sets nothing
    return ProcessGroup.BackendType.GLOO


def _impersonate(pg: Any, plan: Plan, device_id: Any) -> None:
    """Gives an frnccl group the backend types and recorded names plain torch gives the original backend."""
    import torch
    from torch.distributed import distributed_c10d as c10d

    first = next(iter(plan.devices))
    fr = pg._get_backend(torch.device(first))
    custom = c10d.ProcessGroup.BackendType.CUSTOM
    for device, name in plan.devices.items():
        # torch's C++ finds a group's GLOO backend and static_casts it to ProcessGroupGloo (DDP's Logger, for
        # its thread count), so the GLOO type must name torch's own inner Gloo backend. The device, through
        # which every op goes, names the FrBackend: it was registered under CUSTOM by torch, and registering
        # the device again under CUSTOM points it back there. The NCCL type names the FrBackend itself: no
        # such cast reads it, and ProcessGroup::shutdown()/abort(), which go through every backend type, then
        # reach the inner NCCL group only through the FrBackend, after frnccl's own teardown (dump, store).
        inner = getattr(fr, "cpu_backend", None) if name == "gloo" else None
        pg._register_backend(torch.device(device), c10d.Backend.backend_type_map[name], inner or fr)
        if inner is not None:
            pg._register_backend(torch.device(device), custom, fr)
    default_type = default_backend_type(plan, device_id)
    if default_type is not None:
        pg._set_default_backend(default_type)
    world = c10d._world
    entry = world.pg_map.get(pg)
    if entry is not None:
        world.pg_map[pg] = (plan.original, *tuple(entry)[1:])
    configs = getattr(world, "pg_backend_config", None)
    if configs is not None and pg in configs:
        original = str(plan.original) if plan.original is not None else "undefined"
        configs[pg] = str(c10d.BackendConfig(c10d.Backend(original)))
    # torch 2.15 attaches its own recorder hook to groups of backends that do not record themselves, as
    # frnccl's name says; frnccl records this group, so the hook (dropped: detached) would record it twice.
    hooks = getattr(world, "pg_flight_recorder_hooks", None)
    if hooks is not None:
        hooks.pop(pg, None)
    with _groups_lock:
        _frnccl_group_names.add(str(c10d._world.pg_names.get(pg, "")))


def _wrap_helper(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def _new_process_group_helper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        plan = plan_for(bound.arguments.get("backend"))
        if plan is None:
            return original(*args, **kwargs)
        bound.arguments["backend"] = plan.spec
        _creating.devices = plan.devices
        try:
            pg, store = original(*bound.args, **bound.kwargs)
        finally:
            _creating.devices = None
        from torch.distributed import distributed_c10d as c10d

        if isinstance(pg, c10d.ProcessGroup):
            _impersonate(pg, plan, bound.arguments.get("device_id"))
        return pg, store

    setattr(_new_process_group_helper, _MARK, True)
    return _new_process_group_helper


def planned_devices() -> dict[str, str] | None:
    """While FRNCCL_ENABLE creates a group on this thread: device type -> the backend the caller's code
    named for it ("gloo" or "nccl"); None otherwise. frnccl's creator builds an inner NCCL group only for
    a device named nccl: a job that said gloo may run several ranks on one GPU, which NCCL refuses."""
    return getattr(_creating, "devices", None)


def _is_frnccl_group(pg: Any) -> bool:
    from torch.distributed import distributed_c10d as c10d

    with _groups_lock:
        return str(c10d._world.pg_names.get(pg, "")) in _frnccl_group_names


def _split_device(parent: Any, split_fn: Callable[..., Any]) -> Any:
    """The device whose backend this torch's split_group splits; None where torch refuses before looking."""
    import torch

    types = {d.type for d in parent._device_types}
    # torch wraps split_group in its loggers (2.15): the body's names are those of the innermost function.
    looks_at_devices = "parent_device_types" in inspect.unwrap(split_fn).__code__.co_varnames
    # torch 2.15's split_group takes the build's accelerator whether or not one is present; earlier ones
    # need one that is available.
    if looks_at_devices:
        accelerator = torch.accelerator.current_accelerator()
    else:
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if accelerator is not None and accelerator.type in types:
        return accelerator
    # Only torch versions whose split_group looks at the parent's devices split a CPU-only parent (2.15
    # does); earlier ones refuse without an accelerator, and frnccl must refuse the same.
    if "cpu" in types and looks_at_devices:
        return torch.device("cpu")
    return None


def _plain_torch_would_split(parent: Any, split_fn: Callable[..., Any]) -> bool:
    device = _split_device(parent, split_fn)
    if device is None:
        return False
    fr = parent._get_backend(device)
    inner = getattr(fr, "cuda_backend" if device.type == "cuda" else "cpu_backend", None)
    if inner is None and device.type == "cuda":  # a group the code put on gloo: its Gloo serves CUDA tensors
        inner = getattr(fr, "cpu_backend", None)
    return bool(inner is not None and inner.supports_splitting)


def _can_split_by_new_group(c10d: Any, parent: Any, split_ranks: Any) -> bool:
    """Where new groups are exactly what torch's split would give: the parent is the default group (every rank
    of the job calls split_group, so every rank can create every split, in the same order, and the job's
    group count stays the same on all ranks), and each split lists its ranks in ascending order (torch numbers
    a split's ranks in the order given; new_group sorts them)."""
    try:
        splits = [[int(r) for r in ranks] for ranks in split_ranks]
    except (TypeError, ValueError):
        return False
    return parent is c10d._get_default_group() and all(ranks == sorted(set(ranks)) for ranks in splits)


def _split_by_new_group(c10d: Any, parent: Any, split_ranks: Any, timeout: Any, pg_options: Any,
                        group_desc: Any) -> Any:
    """split_group's result built with new_group: the same members, on an frnccl group of the parent's backend.
    Every rank creates every split (_can_split_by_new_group) and keeps its own."""
    global _split_note_given
    if not _split_note_given:
        _split_note_given = True
        print("frnccl: split_group() under FRNCCL_ENABLE builds each split as a new group (an frnccl group cannot "
              "be split into a communicator of its own)", file=sys.stderr)
    me = c10d._get_default_group().rank()
    backend = c10d._world.pg_map[parent][0]
    mine = _not_in_any_split(c10d)
    for ranks in split_ranks:
        members = [int(r) for r in ranks]
        group = c10d.new_group(members, timeout=timeout, backend=backend, pg_options=pg_options,
                               group_desc=group_desc)
        if me in members:
            mine = group
    return mine


def _not_in_any_split(c10d: Any) -> Any:
    """What this torch's split_group returns to a rank in none of the splits: None, or from 2.15 NON_GROUP_MEMBER."""
    returns = str(inspect.signature(c10d.split_group).return_annotation)
    return c10d.GroupMember.NON_GROUP_MEMBER if "NonGroupMember" in returns else None


def _wrap_split_group(c10d: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def split_group(parent_pg: Any = None, split_ranks: Any = None, timeout: Any = None, pg_options: Any = None,
                    group_desc: Any = None, *args: Any, **kwargs: Any) -> Any:
        parent = parent_pg if parent_pg else (c10d._get_default_group() if c10d.is_initialized() else None)
        if parent is None or not _is_frnccl_group(parent) or not split_ranks or args or kwargs:
            return original(parent_pg, split_ranks, timeout, pg_options, group_desc, *args, **kwargs)
        # torch's own checks come first and say what they say (2.11: a default group without a bound device
        # may not be split); only its refusal of frnccl's backend as such, where torch's inner backend of that
        # device would have split, is answered with new groups.
        try:
            return original(parent_pg, split_ranks, timeout, pg_options, group_desc)
        except RuntimeError as err:
            if ("does not support splitting" not in str(err) or not _plain_torch_would_split(parent, original)
                    or not _can_split_by_new_group(c10d, parent, split_ranks)):
                raise
        return _split_by_new_group(c10d, parent, split_ranks, timeout, pg_options, group_desc)

    setattr(split_group, _MARK, True)
    return split_group


def install() -> bool:
    """Puts the wrappers in place (idempotent); False where this torch lacks what they wrap."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    from torch.distributed import distributed_c10d as c10d

    helper = getattr(c10d, "_new_process_group_helper", None)
    if helper is None or not hasattr(c10d, "BackendConfig") or not hasattr(c10d, "_world"):
        return False
    if not getattr(helper, _MARK, False):
        c10d._new_process_group_helper = _wrap_helper(helper)
    split = getattr(c10d, "split_group", None)
    if split is not None and not getattr(split, _MARK, False):
        wrapper = _wrap_split_group(c10d, split)
        c10d.split_group = wrapper
        if getattr(dist, "split_group", None) is split:
            dist.split_group = wrapper
    return True


def active() -> bool:
    """Whether the wrappers are in place in this process."""
    from torch.distributed import distributed_c10d as c10d

    return bool(getattr(getattr(c10d, "_new_process_group_helper", None), _MARK, False))
