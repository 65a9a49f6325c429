"""Small real workloads, unchanged under frnccl or gloo: argv WORKLOAD BACKEND.

Each prints, per rank, digests of what it computed (test_workloads.py compares them between the two
backends: bit-identical, since frnccl hands every op to the same Gloo algorithms) and what frnccl made
of idling past the group timeout afterwards (_workload.past_timeout).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from _workload import RANK, TIMEOUT, WORLD, digest, finish, past_timeout, start


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8), nn.ReLU(), nn.Linear(8, 4))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + RANK)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def ddp() -> dict[str, Any]:
    """DDP training on a group of its own (short timeout), two buckets, SGD."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    group = dist.new_group(timeout=TIMEOUT)
    model = DDP(_model(), process_group=group, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(6):
        x, y = _batch(step)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return {"digests": {"params": digest(*model.parameters()), "losses": digest(*losses)},
            "past_timeout": past_timeout(group)}


def fsdp2() -> dict[str, Any]:
    """FSDP2 (fully_shard per layer and at the root) over a 1-D CPU DeviceMesh; Adam; full params at the end."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))  # the default group: its timeout is TIMEOUT
    model = _model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for step in range(4):
        x, y = _batch(step)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    full = [p.full_tensor() for p in model.parameters()]
    return {"digests": {"params": digest(*full), "losses": digest(*losses),
                        "local_shards": digest(*(p.to_local() for p in model.parameters()))},
            "past_timeout": past_timeout(mesh.get_group())}


def dtensor_2d() -> dict[str, Any]:
    """A 2x2 DeviceMesh from groups with the short timeout; Partial->Shard (a reduce_scatter), Shard->Replicate
    (an all_gather) and Partial->Replicate (an all_reduce) along each dimension and both at once."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    layout = torch.arange(WORLD).reshape(2, WORLD // 2)
    groups: dict[str, Any] = {}
    for name, rows in (("dp", layout.t()), ("tp", layout)):  # dp: down a column, tp: along a row
        for ranks in rows.tolist():
            g = dist.new_group(ranks, timeout=TIMEOUT)
            if RANK in ranks:
                groups[name] = g
    mesh = DeviceMesh.from_group([groups["dp"], groups["tp"]], "cpu", mesh=layout, mesh_dim_names=("dp", "tp"))
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
    return {"digests": {k: digest(v) for k, v in out.items()},
            "past_timeout": {"dp": past_timeout(groups["dp"]), "tp": past_timeout(groups["tp"])}}


def _funcol_ops(group: Any) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    import torch.distributed._functional_collectives as funcol

    def ops(x: torch.Tensor) -> list[torch.Tensor]:
        r = funcol.all_reduce(x, "sum", group)
        s = funcol.reduce_scatter_tensor(x * 2, "sum", 0, group)
        g = funcol.all_gather_tensor(s + 1, 0, group)
        a = funcol.all_to_all_single(x, None, None, group)
        return [r, s, g, a, r.sum() + g.sum()]

    return ops


def funcol() -> dict[str, Any]:
    """Functional collectives (all_reduce, reduce_scatter_tensor, all_gather_tensor, all_to_all_single), eager."""
    group = dist.new_group(timeout=TIMEOUT)
    ops = _funcol_ops(group)
    out = [t for step in range(3) for t in ops(torch.arange(8.0 * WORLD) * (RANK + 1) + step)]
    return {"digests": {"eager": digest(*out)}, "past_timeout": past_timeout(group)}


def funcol_compiled() -> dict[str, Any]:
    """The same functional collectives under torch.compile (inductor), then once more eagerly to compare."""
    group = dist.new_group(timeout=TIMEOUT)
    ops = _funcol_ops(group)
    compiled = torch.compile(ops, fullgraph=True)
    xs = [torch.arange(8.0 * WORLD) * (RANK + 1) + step for step in range(3)]
    got = [t for x in xs for t in compiled(x)]
    want = [t for x in xs for t in ops(x)]
    return {"digests": {"compiled": digest(*got)},
            "compiled_equals_eager": all(torch.equal(a, b) for a, b in zip(got, want)),
            "past_timeout": past_timeout(group)}


def p2p() -> dict[str, Any]:
    """A pipeline's p2p: each stage receives activations from the previous rank and sends its output on,
    forward then backward (gradients the other way), with batch_isend_irecv, over 4 micro-batches."""
    group = dist.new_group(timeout=TIMEOUT)
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    torch.manual_seed(RANK)
    w = torch.randn(16, 16) / 4
    seen = []
    for mb in range(4):
        act = torch.full((16,), float(mb + RANK))
        recv_act, recv_grad = torch.empty(16), torch.empty(16)
        ops = [dist.P2POp(dist.isend, act @ w, nxt, group), dist.P2POp(dist.irecv, recv_act, prv, group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        grad = recv_act.tanh()
        ops = [dist.P2POp(dist.irecv, recv_grad, nxt, group), dist.P2POp(dist.isend, grad, prv, group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        seen += [recv_act.clone(), recv_grad.clone()]
    return {"digests": {"received": digest(*seen)}, "past_timeout": past_timeout(group)}


def objects() -> dict[str, Any]:
    """Object collectives: all_gather_object, gather_object, broadcast_object_list, scatter_object_list."""
    group = dist.new_group(timeout=TIMEOUT)
    mine = {"rank": RANK, "name": f"r{RANK}", "t": torch.arange(3) * RANK, "nested": [RANK, (RANK, "x")]}
    gathered: list[Any] = [None] * WORLD
    dist.all_gather_object(gathered, mine, group=group)
    to_root: list[Any] | None = [None] * WORLD if RANK == 0 else None
    dist.gather_object(mine, to_root, dst=0, group=group)
    bcast: list[Any] = [{"step": 7, "cfg": "a" * 100}, torch.ones(2)] if RANK == 0 else [None, None]
    dist.broadcast_object_list(bcast, src=0, group=group)
    scattered: list[Any] = [None]
    dist.scatter_object_list(scattered, [f"to {r}" for r in range(WORLD)] if RANK == 0 else None, src=0, group=group)
    return {"digests": {"all_gather": digest(gathered), "gather": digest(to_root), "broadcast": digest(bcast),
                        "scatter": digest(scattered)},
            "past_timeout": past_timeout(group)}


WORKLOADS: dict[str, Callable[[], dict[str, Any]]] = {
    f.__name__: f for f in (ddp, fsdp2, dtensor_2d, funcol, funcol_compiled, p2p, objects)
}

if __name__ == "__main__":
    start()
    finish(WORKLOADS[sys.argv[1]]())
