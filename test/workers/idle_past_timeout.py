"""Every op of the frnccl backend, issued and waited on a group of its own with a short timeout, then the job
idles past that timeout: a healthy job, which must run on with no incident and show every op completed. Some
ops are waited only after the idle, or never, with a later op of their group after them.

Each op gets its own group, so no later op of the same group can settle it: what shows it done is its own
Work, or the caller's wait. argv[1]: the groups' timeout in seconds.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import fr_backend
from _worker import RANK, WORLD, init

warnings.filterwarnings("ignore", message="Sparse invariant checks")
TIMEOUT_S = float(sys.argv[1])
PEER = 1 - RANK
N = 4


def failure(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def t(fill: float, n: int = N) -> torch.Tensor:
    return torch.full((n,), float(fill))


def p2p(g: dist.ProcessGroup) -> None:
    buf = t(RANK)
    if RANK == 0:
        dist.send(buf, dst=1, group=g)
    else:
        dist.recv(buf, src=0, group=g)


def p2p_async(g: dist.ProcessGroup) -> None:
    buf = t(RANK)
    work = dist.isend(buf, dst=1, group=g) if RANK == 0 else dist.irecv(buf, src=0, group=g)
    work.wait()


def recv_any_source(g: dist.ProcessGroup) -> None:
    buf = t(RANK)
    if RANK == 0:
        dist.send(buf, dst=1, group=g)
    else:
        dist.recv(buf, group=g)  # no src: recvAnysource


def batch_p2p(g: dist.ProcessGroup) -> None:
    send, recv = t(RANK), t(-1)
    ops = [dist.P2POp(dist.isend, send, PEER, g), dist.P2POp(dist.irecv, recv, PEER, g)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def all_reduce_sparse(g: dist.ProcessGroup) -> None:
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, float(RANK)]), (N,))
    dist.all_reduce(sparse, group=g)


def reduce_scatter_coalesced(g: dist.ProcessGroup) -> None:
    outs = [t(0), t(0)]
    with dist._coalescing_manager(group=g, async_ops=True) as cm:
        for o in outs:
            dist.reduce_scatter_tensor(o, t(RANK + 1, N * WORLD), group=g)
    cm.wait()


def all_gather_coalesced_tensors(g: dist.ProcessGroup) -> None:
    outs = [t(0, N * WORLD), t(0, N * WORLD)]
    with dist._coalescing_manager(group=g, async_ops=True) as cm:
        for o in outs:
            dist.all_gather_into_tensor(o, t(RANK), group=g)
    cm.wait()


def funcol_reduce_scatter(g: dist.ProcessGroup) -> None:
    out = funcol.reduce_scatter_tensor(t(RANK + 1, N * WORLD), "sum", 0, g)
    funcol.wait_tensor(out)


def funcol_all_gather(g: dist.ProcessGroup) -> None:
    funcol.wait_tensor(funcol.all_gather_tensor(t(RANK), 0, g))


def dtensor_redistribute(g: dist.ProcessGroup) -> None:
    # As tensor and sequence parallelism do: Partial -> Shard is a reduce_scatter, Shard -> Replicate an all_gather.
    mesh = DeviceMesh.from_group(g, "cpu")
    partial = DTensor.from_local(torch.ones(2 * WORLD, 4) * (RANK + 1), mesh, [Partial()])
    sharded = partial.redistribute(mesh, [Shard(0)])
    sharded.redistribute(mesh, [Replicate()]).to_local()


def scatter(g: dist.ProcessGroup) -> None:
    dist.scatter(t(0), [t(i) for i in range(WORLD)] if RANK == 0 else None, src=0, group=g)


def gather(g: dist.ProcessGroup) -> None:
    dist.gather(t(RANK), [t(0) for _ in range(WORLD)] if RANK == 0 else None, dst=0, group=g)


# name -> how to issue it and wait for it. Names are the groups' descriptions in the dump.
OPS: dict[str, Callable[[dist.ProcessGroup], object]] = {
    "broadcast": lambda g: dist.broadcast(t(RANK), src=0, group=g),
    "all_reduce": lambda g: dist.all_reduce(t(RANK), group=g),
    "all_reduce_async": lambda g: dist.all_reduce(t(RANK), group=g, async_op=True).wait(),
    "all_reduce_sparse": all_reduce_sparse,
    "all_reduce_coalesced": lambda g: dist.all_reduce_coalesced([t(RANK), t(RANK, 2)], group=g),
    "reduce": lambda g: dist.reduce(t(RANK), dst=0, group=g),
    "all_gather": lambda g: dist.all_gather([t(0) for _ in range(WORLD)], t(RANK), group=g),
    "all_gather_into_tensor": lambda g: dist.all_gather_into_tensor(t(0, N * WORLD), t(RANK), group=g),
    "all_gather_coalesced": lambda g: dist.all_gather_coalesced(
        [[t(0), t(0, 2)] for _ in range(WORLD)], [t(RANK), t(RANK, 2)], group=g),
    "all_gather_into_tensor_coalesced": all_gather_coalesced_tensors,
    "gather": gather,
    "scatter": scatter,
    "reduce_scatter": lambda g: dist.reduce_scatter(t(0), [t(RANK + i) for i in range(WORLD)], group=g),
    "reduce_scatter_async": lambda g: dist.reduce_scatter(
        t(0), [t(RANK + i) for i in range(WORLD)], group=g, async_op=True).wait(),
    "reduce_scatter_tensor": lambda g: dist.reduce_scatter_tensor(t(0), t(RANK + 1, N * WORLD), group=g),
    "reduce_scatter_tensor_async": lambda g: dist.reduce_scatter_tensor(
        t(0), t(RANK + 1, N * WORLD), group=g, async_op=True).wait(),
    "reduce_scatter_tensor_coalesced": reduce_scatter_coalesced,
    "all_to_all": lambda g: dist.all_to_all([t(0) for _ in range(WORLD)], [t(RANK + i) for i in range(WORLD)], group=g),
    "all_to_all_single": lambda g: dist.all_to_all_single(t(0, N * WORLD), t(RANK, N * WORLD), group=g),
    "barrier": lambda g: dist.barrier(group=g),
    "monitored_barrier": lambda g: g.monitored_barrier(timedelta(seconds=30), wait_all_ranks=True),
    "send_recv": p2p,
    "isend_irecv": p2p_async,
    "recv_any_source": recv_any_source,
    "batch_isend_irecv": batch_p2p,
    "funcol_reduce_scatter": funcol_reduce_scatter,
    "funcol_all_gather": funcol_all_gather,
    "dtensor_redistribute": dtensor_redistribute,
    # Async, never waited, then another collective of the group: the later one shows the first done.
    "reduce_scatter_tensor_then_all_gather": lambda g: (
        dist.reduce_scatter_tensor(t(0), t(RANK + 1, N * WORLD), group=g, async_op=True),
        dist.all_gather_into_tensor(t(0, N * WORLD), t(RANK), group=g)),
}

# name -> how to issue it; its Work is waited only after the job idled past the timeout.
LATE_WAITS: dict[str, Callable[[dist.ProcessGroup], dist.Work]] = {
    "reduce_scatter_tensor_waited_late": lambda g: dist.reduce_scatter_tensor(
        t(0), t(RANK + 1, N * WORLD), group=g, async_op=True),
    "all_reduce_waited_late": lambda g: dist.all_reduce(t(RANK), group=g, async_op=True),
}


def main() -> None:
    init("frnccl")
    groups = {name: dist.new_group(backend="frnccl", timeout=timedelta(seconds=TIMEOUT_S), group_desc=name)
              for name in [*OPS, *LATE_WAITS]}
    errors: dict[str, str] = {}
    unsupported: dict[str, str] = {}  # ops the inner backend of this torch version refuses
    for name, issue in OPS.items():
        try:
            issue(groups[name])
        except Exception as e:  # reported, and fails the test
            text = failure(e)
            (unsupported if "does not support" in text else errors)[name] = text
    late = {name: issue(groups[name]) for name, issue in LATE_WAITS.items()}
    last_waited = time.monotonic()
    # Idle past every group's deadline, plus a watchdog pass or two at its idle pace: a clock condition,
    # which is what is under test, not a guess at how long something takes.
    while time.monotonic() < last_waited + TIMEOUT_S + 1.5:
        time.sleep(0.1)
    for name, work in late.items():
        try:
            work.wait()
        except Exception as e:
            errors[name] = failure(e)
    # The dump asks the watchdog for a pass of its own first: a pass that began past every deadline.
    folder = fr_backend.dump("after_idle")
    states: dict[str, list[str]] = {}
    for e in fr_backend.trace_entries(symbolize=False)["entries"]:
        desc = e["process_group"][1]
        if desc in groups:
            states.setdefault(desc, []).append(e["state"])
    # A group that timed out is aborted, and its next op fails: each group must still work.
    after: dict[str, str] = {}
    for name, g in groups.items():
        try:
            dist.all_reduce(t(1), group=g)
        except Exception as e:
            after[name] = failure(e)
    try:
        dist.barrier()
    except Exception as e:
        after["<default group>"] = failure(e)
    result = dict(rank=RANK, errors=errors, unsupported=unsupported, states=states, after=after,
                  dump_folder=folder, dump_dir=os.environ["FRNCCL_DUMP_DIR"])
    print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
