"""Every collective through frnccl (default group) against plain gloo over the same ranks.

Usage: collectives.py [--quick]
Each case runs once on a `new_group(backend="gloo")` over all ranks and once on
the default frnccl group, with identical rank-dependent inputs, and compares.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from _ops import BIG, cases, settle
from _worker import RANK, WORLD, Checks, finish, init

QUICK = "--quick" in sys.argv

init("frnccl")
FR = dist.group.WORLD
GLOO = dist.new_group(backend="gloo")
checks = Checks()

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16, torch.float16, torch.uint8]
SIZES = [1, 1000, BIG]
# ~1M elements is slow on a 2-core box: a subset of ops and dtypes covers large messages.
BIG_CASES = {"all_reduce/RedOpType.SUM", "all_reduce/RedOpType.MAX", "broadcast", "reduce", "all_gather",
             "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single/uneven", "scatter"}
BIG_MODES = {torch.float32: (False, True), torch.int64: (False,), torch.bfloat16: (False,)}


t0 = time.monotonic()
for dt in DTYPES:
    for n in SIZES:
        for a in (False, True):
            if n == BIG and (QUICK or a not in BIG_MODES.get(dt, ())):
                continue
            tag = f"{str(dt).replace('torch.', '')}/n={n}/{'async' if a else 'sync'}"
            for op_name, fn in cases(tag, n, dt, a, WORLD):
                if n == BIG and op_name not in BIG_CASES:
                    continue
                checks.compare(f"{op_name}/{tag}", fn, GLOO, FR)
checks.notes["collectives_s"] = round(time.monotonic() - t0, 2)


# ---- barriers: rank 0 arrives late; everyone else must wait for it ----
def delayed(fn):
    def run(g):
        dist.barrier(group=GLOO)  # line everyone up first
        if RANK == 0:
            time.sleep(0.4)
        start = time.monotonic()
        fn(g)
        waited = time.monotonic() - start
        return waited >= 0.25 if RANK != 0 else True
    return run


for a in (False, True):
    checks.compare(f"barrier/{'async' if a else 'sync'}",
                   delayed(lambda g, a=a: settle(dist.barrier(group=g, async_op=a), a)), GLOO, FR)
# The group's own monitored_barrier (what dist.monitored_barrier calls for gloo).
checks.compare("monitored_barrier/method",
               delayed(lambda g: g.monitored_barrier(timedelta(seconds=30), wait_all_ranks=True)), GLOO, FR)
# torch's function (before 2.14 it refuses any backend not named gloo; frnccl's registration routes it), with a
# late rank, given the group, the default group (None), a float timeout (torch converts it, warning), no timeout.
try:
    checks.compare("dist.monitored_barrier/group", delayed(
        lambda g: dist.monitored_barrier(group=g, timeout=timedelta(seconds=30), wait_all_ranks=True)), GLOO, FR)
    checks.compare("dist.monitored_barrier/float_timeout", delayed(
        lambda g: dist.monitored_barrier(group=g, timeout=30.0)), GLOO, FR)
    checks.compare("dist.monitored_barrier/default_timeout", delayed(lambda g: dist.monitored_barrier(group=g)),
                   GLOO, FR)
    delayed(lambda g: dist.monitored_barrier(timeout=timedelta(seconds=30)))(None)  # the default group: frnccl
    checks.notes["dist.monitored_barrier"] = "ok"
except Exception as e:
    checks.notes["dist.monitored_barrier"] = f"{type(e).__name__}: {e}"


# ---- objects ----
def all_gather_object(g):
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": RANK, "payload": list(range(RANK + 2)), "s": "x" * (RANK * 100)}, group=g)
    return objs


def broadcast_object_list(g):
    src = WORLD - 1
    objs = [{"from": RANK, "t": torch.arange(5) * RANK}, "abc" * RANK, None] if RANK == src else [None, None, None]
    dist.broadcast_object_list(objs, src=src, group=g)
    return [objs[0]["from"], objs[0]["t"], objs[1], objs[2]]


checks.compare("all_gather_object", all_gather_object, GLOO, FR)
checks.compare("broadcast_object_list", broadcast_object_list, GLOO, FR)


# ---- a 'meta' tensor: torch's meta kernels answer it (neither backend sees it);
# frnccl must behave exactly like gloo (no crash, same result or same error) ----
def meta_all_reduce(g):
    t = torch.empty(4, device="meta")
    dist.all_reduce(t, group=g)
    return t


checks.compare("meta_tensor/all_reduce", meta_all_reduce, GLOO, FR)

# ---- backend name of the default group ----
checks.expect("get_backend", dist.get_backend() == "frnccl", f"dist.get_backend() == {dist.get_backend()!r}")
checks.expect("get_backend/gloo_group", dist.get_backend(GLOO) == "gloo", f"{dist.get_backend(GLOO)!r}")

finish(checks)
