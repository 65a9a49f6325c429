"""Calls fr_backend.wrap's public functions with one bad argument each (test_wrap_inputs.py).

argv[1] "bad_inputs": prints one JSON line per call: {"case", "raised" (exception type name or null), "message", "stderr", "returned_given" (the
group it was given came back)}, then
{"frnccl_threads": [...]} (the threads named frnccl-* alive after every bad call: a bad call starts no life),
then {"good": ...}: the same arguments with nothing bad, so that each case is bad only where it says.
argv[1] "drop_then_wrap": wraps a backend, lets the FrBackend go without a shutdown (a library that drops its
group), wraps again (a new life) and prints {"rewrapped": ...}.
"""

from __future__ import annotations

import contextlib
import io
import json
import gc
import math
import os
import sys
from datetime import timedelta
from typing import Any, Callable

import torch.distributed as dist

from fr_backend import wrap

store = dist.HashStore()
gloo = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=10))
pg = dist.ProcessGroup(store, 0, 1)
pg._register_backend(__import__("torch").device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
good: dict[str, Any] = dict(backend=gloo, store=store, rank=0, world_size=1, group_name="wrap_inputs",
                            timeout=10.0)


def backend_call(**bad: Any) -> Callable[[], Any]:
    args = {**good, **bad}
    return lambda: wrap.wrap_backend(args.pop("backend"), args.pop("store"), args.pop("rank"),
                                     args.pop("world_size"), **args)


def group_call(fn: Callable[..., Any], **bad: Any) -> Callable[[], Any]:
    args = {"pg": pg, **{k: v for k, v in good.items() if k != "backend"}, **bad}
    return lambda: fn(args.pop("pg"), args.pop("store"), args.pop("rank"), args.pop("world_size"), **args)


if sys.argv[1] == "drop_then_wrap":
    dropped = backend_call()()
    print(json.dumps({"first": dropped.name()}), flush=True)
    del dropped
    gc.collect()
    print(json.dumps({"rewrapped": backend_call()().name()}), flush=True)
    os._exit(0)

# (case, the argument it gets wrong, the call)
CASES: list[tuple[str, str, Callable[[], Any]]] = [
    ("rank_negative", "rank", backend_call(rank=-1)),
    ("rank_past_world", "rank", backend_call(rank=1)),
    ("rank_text", "rank", backend_call(rank="zero")),
    ("rank_fraction", "rank", backend_call(rank=0.5)),
    ("rank_none", "rank", backend_call(rank=None)),
    ("rank_bool", "rank", backend_call(rank=False)),
    ("world_size_zero", "world_size", backend_call(world_size=0)),
    ("world_size_text", "world_size", backend_call(world_size="one")),
    ("timeout_zero", "timeout", backend_call(timeout=0)),
    ("timeout_negative_timedelta", "timeout", backend_call(timeout=timedelta(seconds=-5))),
    ("timeout_zero_timedelta", "timeout", backend_call(timeout=timedelta(0))),
    ("timeout_text", "timeout", backend_call(timeout="soon")),
    ("timeout_none", "timeout", backend_call(timeout=None)),
    ("timeout_nan", "timeout", backend_call(timeout=math.nan)),
    ("timeout_inf", "timeout", backend_call(timeout=math.inf)),
    ("timeout_under_a_ms", "timeout", backend_call(timeout=0.0001)),
    ("backend_object", "backend", backend_call(backend=object())),
    ("backend_process_group", "backend", backend_call(backend=pg)),
    ("backend_none", "backend", backend_call(backend=None)),
    ("store_object", "store", backend_call(store=object())),
    ("global_ranks_length", "global_ranks", backend_call(global_ranks=[0, 1])),
    ("global_ranks_text", "global_ranks", backend_call(global_ranks=["a"])),
    ("global_ranks_negative", "global_ranks", backend_call(global_ranks=[-3])),
    ("global_ranks_repeated", "global_ranks", backend_call(world_size=2, global_ranks=[4, 4])),
    ("group_name_empty", "group_name", backend_call(group_name="")),
    ("pg_object", "pg", group_call(wrap.wrap_process_group, pg=object())),
    ("pg_rank", "rank", group_call(wrap.wrap_process_group, rank=4)),
    ("or_warn_pg_object", "pg", group_call(wrap.wrap_process_group_or_warn, pg=object())),
    ("or_warn_rank", "rank", group_call(wrap.wrap_process_group_or_warn, rank=4)),
    ("or_warn_timeout", "timeout", group_call(wrap.wrap_process_group_or_warn, timeout="soon")),
    ("or_warn_store_object", "store", group_call(wrap.wrap_process_group_or_warn, store=object())),
]

for name, argument, call in CASES:
    err = io.StringIO()
    raised, message, returned = None, "", None
    with contextlib.redirect_stderr(err):
        try:
            returned = call()
        except Exception as exc:  # noqa: BLE001 - what each bad call raises is the result
            raised, message = type(exc).__name__, str(exc)
    print(json.dumps({"case": name, "argument": argument, "raised": raised, "message": message, "stderr": err.getvalue(),
                      "returned_given": returned is pg or (argument == "pg" and returned is not None)}),
          flush=True)

threads = []
for task in os.listdir("/proc/self/task"):
    with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/comm") as comm:
        threads.append(comm.read().strip())
print(json.dumps({"frnccl_threads": sorted(t for t in threads if t.startswith("frnccl"))}), flush=True)
fr = backend_call()()
print(json.dumps({"good": fr.name()}), flush=True)
os._exit(0)  # the good call's life: nothing here waits for its teardown
