"""Small real workloads, unchanged under frnccl or gloo: argv WORKLOAD[,WORKLOAD...] BACKEND.

The workloads run one after another in one job (a job's start-up costs more than most of them), each on
groups of its own with the short timeout. Each rank prints digests of what each workload computed
(test_workloads.py compares them between the two backends: bit-identical, since frnccl hands every op
to the same Gloo algorithm), then what frnccl made of idling past the group timeout (_workload.past_timeout).
A workload that raises is reported as such, and the ones after it do not run.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from _workload import RANK, TIMEOUT, WORLD, digest, finish, past_timeout, start

GROUPS: dict[str, Any] = {}  # every group a workload used, by name: past_timeout() checks each


def group(name: str, ranks: list[int] | None = None) -> Any:
    g = dist.new_group(ranks, timeout=TIMEOUT)
    if ranks is None or RANK in ranks:
        GROUPS[name] = g
    return g


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8), nn.ReLU(), nn.Linear(8, 4))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + RANK)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> list[torch.Tensor]:
    """`steps` steps of regression on each rank's own batches; the losses."""
    losses = []
    for step in range(steps):
        x, y = _batch(step)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def ddp() -> dict[str, Any]:
    """DDP training on a group of its own (short timeout), 1 KB buckets (several all_reduces a step), SGD."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model(), process_group=group("ddp"), bucket_cap_mb=0.001)
    losses = _train(model, torch.optim.SGD(model.parameters(), lr=0.05), steps=6)
    return {"params": digest(*model.parameters()), "losses": digest(*losses)}


def fsdp2() -> dict[str, Any]:
    """FSDP2 (fully_shard per layer and at the root) over a 1-D CPU DeviceMesh; Adam; full params at the end."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))  # the default group: its timeout is TIMEOUT
    GROUPS["fsdp2"] = mesh.get_group()
    model = _model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    losses = _train(model, torch.optim.Adam(model.parameters(), lr=0.01), steps=4)
    full = [p.full_tensor() for p in model.parameters()]
    return {"params": digest(*full), "losses": digest(*losses),
            "local_shards": digest(*(p.to_local() for p in model.parameters()))}


def dtensor_2d() -> dict[str, Any]:
    """A 2x2 DeviceMesh from groups with the short timeout; Partial->Shard (a reduce_scatter), Shard->Replicate
    (an all_gather) and Partial->Replicate (an all_reduce) along each dimension and both at once."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    layout = torch.arange(WORLD).reshape(2, WORLD // 2)
    for name, rows in (("dp", layout.t()), ("tp", layout)):  # dp: down a column, tp: along a row
        for ranks in rows.tolist():
            group(f"dtensor_{name}", ranks)
    mesh = DeviceMesh.from_group([GROUPS["dtensor_dp"], GROUPS["dtensor_tp"]], "cpu", mesh=layout,
                                 mesh_dim_names=("dp", "tp"))
    base = torch.arange(64, dtype=torch.float32).reshape(8, 8) * (RANK + 1) / 7
    out = {}
    for step in range(3):
        x = base + step
        p = DTensor.from_local(x, mesh, [Partial(), Partial()])
        out[f"{step}/pp->ss"] = p.redistribute(mesh, [Shard(0), Shard(1)]).to_local()
        s = DTensor.from_local(x, mesh, [Replicate(), Partial()]).redistribute(mesh, [Replicate(), Shard(0)])
        out[f"{step}/rp->rs"] = s.to_local()
        out[f"{step}/rs->rr"] = s.redistribute(mesh, [Replicate(), Replicate()]).to_local()
        out[f"{step}/pr->rr"] = DTensor.from_local(x, mesh, [Partial(), Replicate()]).redistribute(
            mesh, [Replicate(), Replicate()]).to_local()
        out[f"{step}/ss->rr"] = DTensor.from_local(x, mesh, [Shard(0), Shard(1)]).full_tensor()
    return {k: digest(v) for k, v in out.items()}


def _funcol_ops(pg: Any) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    import torch.distributed._functional_collectives as funcol

    def ops(x: torch.Tensor) -> list[torch.Tensor]:
        r = funcol.all_reduce(x, "sum", pg)
        s = funcol.reduce_scatter_tensor(x * 2, "sum", 0, pg)
        g = funcol.all_gather_tensor(s + 1, 0, pg)
        a = funcol.all_to_all_single(x, None, None, pg)
        return [r, s, g, a, r.sum() + g.sum()]

    return ops


def funcol() -> dict[str, Any]:
    """Functional collectives (all_reduce, reduce_scatter_tensor, all_gather_tensor, all_to_all_single), eager."""
    ops = _funcol_ops(group("funcol"))
    out = [t for step in range(3) for t in ops(torch.arange(8.0 * WORLD) * (RANK + 1) + step)]
    return {"eager": digest(*out)}


def funcol_compiled() -> dict[str, Any]:
    """The same functional collectives under torch.compile, then once more eagerly to compare.

    The compiled graph calls the same _c10d_functional ops on the group as eager code does, whichever
    compiler backend runs it; aot_eager (dynamo, AOT autograd, functionalization; no code generation) keeps
    the job short. inductor works too (WORKLOAD_COMPILE_BACKEND=inductor), but its first compile takes
    about a minute on two busy cores.
    """
    ops = _funcol_ops(group("funcol_compiled"))
    compiled = torch.compile(ops, fullgraph=True, backend=os.environ.get("WORKLOAD_COMPILE_BACKEND", "aot_eager"))
    xs = [torch.arange(8.0 * WORLD) * (RANK + 1) + step for step in range(3)]
    got = [t for x in xs for t in compiled(x)]
    want = [t for x in xs for t in ops(x)]
    return {"compiled": digest(*got), "compiled_equals_eager": repr(all(torch.equal(a, b) for a, b in zip(got, want)))}


def p2p() -> dict[str, Any]:
    """A pipeline's p2p: each stage receives activations from the previous rank and sends its output on,
    forward then backward (gradients the other way), with batch_isend_irecv, over 4 micro-batches."""
    g = group("p2p")
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    torch.manual_seed(RANK)
    w = torch.randn(16, 16) / 4
    seen = []
    for mb in range(4):
        act = torch.full((16,), float(mb + RANK))
        recv_act, recv_grad = torch.empty(16), torch.empty(16)
        ops = [dist.P2POp(dist.isend, act @ w, nxt, g), dist.P2POp(dist.irecv, recv_act, prv, g)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        grad = recv_act.tanh()
        ops = [dist.P2POp(dist.irecv, recv_grad, nxt, g), dist.P2POp(dist.isend, grad, prv, g)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        seen += [recv_act.clone(), recv_grad.clone()]
    return {"received": digest(*seen)}


def objects() -> dict[str, Any]:
    """Object collectives: all_gather_object, gather_object, broadcast_object_list, scatter_object_list."""
    g = group("objects")
    mine = {"rank": RANK, "name": f"r{RANK}", "t": torch.arange(3) * RANK, "nested": [RANK, (RANK, "x")]}
    gathered: list[Any] = [None] * WORLD
    dist.all_gather_object(gathered, mine, group=g)
    to_root: list[Any] | None = [None] * WORLD if RANK == 0 else None
    dist.gather_object(mine, to_root, dst=0, group=g)
    bcast: list[Any] = [{"step": 7, "cfg": "a" * 100}, torch.ones(2)] if RANK == 0 else [None, None]
    dist.broadcast_object_list(bcast, src=0, group=g)
    scattered: list[Any] = [None]
    dist.scatter_object_list(scattered, [f"to {r}" for r in range(WORLD)] if RANK == 0 else None, src=0, group=g)
    return {"all_gather": digest(gathered), "gather": digest(to_root), "broadcast": digest(bcast),
            "scatter": digest(scattered)}


WORKLOADS: dict[str, Callable[[], dict[str, Any]]] = {
    f.__name__: f for f in (ddp, fsdp2, dtensor_2d, funcol, funcol_compiled, p2p, objects)
}


def main() -> None:
    start()
    results: dict[str, Any] = {}
    for name in sys.argv[1].split(","):
        began = time.monotonic()
        try:
            results[name] = {"digests": WORKLOADS[name]()}
        except Exception as err:  # the test names it; frnccl's own log lines say more
            results[name] = {"error": f"{type(err).__name__}: {str(err).strip()[:500]}"}
            traceback.print_exc()
            break
        finally:
            results[name]["seconds"] = round(time.monotonic() - began, 2)
    failed = any("error" in r for r in results.values())
    past = {} if failed else past_timeout(GROUPS)
    finish({"workloads": results, "past_timeout": past})
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
