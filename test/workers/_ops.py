"""Collective cases shared by the workers: each is fn(group) -> tensors to compare.

Inputs depend on the rank, the case and nothing else, so running a case on the
gloo reference group and on the frnccl group feeds both identical data.
"""

from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

from _worker import RANK

BIG = 1 << 20
# Where inputs and outputs live; the GPU worker sets it to its CUDA device.
DEVICE = torch.device("cpu")


def zeros(n: int, dt: torch.dtype) -> torch.Tensor:
    return torch.zeros(n, dtype=dt, device=DEVICE)


def data(name: str, numel: int, dtype: torch.dtype, rank: int = RANK, salt: int = 0) -> torch.Tensor:
    """Deterministic, rank-dependent input (the same on every call for the same arguments)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}/{rank}/{salt}".encode()))
    if dtype.is_floating_point:
        t = (torch.rand(numel, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)
    elif dtype == torch.uint8:
        t = torch.randint(0, 4, (numel,), generator=g, dtype=dtype)
    else:
        t = torch.randint(-8, 8, (numel,), generator=g, dtype=dtype)
    return t.to(DEVICE)


def settle(work, async_op: bool):
    """Wait for an async op; a sync op must return None (or a completed work)."""
    if async_op:
        assert work is not None, "async_op=True returned no work"
        work.wait()
    return work


def gr(g, local: int) -> int:
    return dist.get_global_rank(g, local)


def cases(name: str, n: int, dt: torch.dtype, a: bool, W: int):
    """(case name, fn(group) -> tensors to compare) for one dtype/size/mode; W: group size."""
    last = W - 1
    out = []
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.AVG]
    if not dt.is_floating_point:
        ops += [dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR]
    elif dt == torch.float32:
        ops += [dist.ReduceOp.BAND]  # gloo refuses bitwise ops on floats
    for op in ops:
        def all_reduce(g, op=op):
            t = data(name, n, dt)
            settle(dist.all_reduce(t, op=op, group=g, async_op=a), a)
            return t
        out.append((f"all_reduce/{op}", all_reduce))

    def broadcast(g):
        t = data(name, n, dt)
        settle(dist.broadcast(t, src=gr(g, last), group=g, async_op=a), a)
        return t

    def reduce(g):
        t = data(name, n, dt)
        dst = last
        settle(dist.reduce(t, dst=gr(g, dst), op=dist.ReduceOp.SUM, group=g, async_op=a), a)
        return t if g.rank() == dst else []

    def reduce_max_root0(g):
        t = data(name, n, dt)
        settle(dist.reduce(t, dst=gr(g, 0), op=dist.ReduceOp.MAX, group=g, async_op=a), a)
        return t if g.rank() == 0 else []

    def all_reduce_coalesced(g):
        ts = [data(name, n, dt, salt=1), data(name, n // 2 + 1, dt, salt=2)]
        settle(dist.all_reduce_coalesced(ts, op=dist.ReduceOp.SUM, group=g, async_op=a), a)
        return ts

    def all_gather(g):
        t = data(name, n, dt)
        outs = [zeros(n, dt) for _ in range(W)]
        settle(dist.all_gather(outs, t, group=g, async_op=a), a)
        return outs

    def all_gather_into_tensor(g):
        t = data(name, n, dt)
        o = zeros(n * W, dt)
        settle(dist.all_gather_into_tensor(o, t, group=g, async_op=a), a)
        return o

    def all_gather_coalesced(g):
        ins = [data(name, n, dt, salt=1), data(name, 3, dt, salt=2)]
        outs = [[zeros(n, dt), zeros(3, dt)] for _ in range(W)]
        settle(dist.all_gather_coalesced(outs, ins, group=g, async_op=a), a)
        return outs

    def reduce_scatter(g):
        ins = [data(name, n, dt, salt=i) for i in range(W)]
        o = zeros(n, dt)
        settle(dist.reduce_scatter(o, ins, op=dist.ReduceOp.SUM, group=g, async_op=a), a)
        return o

    def reduce_scatter_tensor(g):
        t = data(name, n * W, dt)
        o = zeros(n, dt)
        settle(dist.reduce_scatter_tensor(o, t, op=dist.ReduceOp.SUM, group=g, async_op=a), a)
        return o

    def all_to_all(g):
        ins = [data(name, n, dt, salt=i) for i in range(W)]
        outs = [zeros(n, dt) for _ in range(W)]
        settle(dist.all_to_all(outs, ins, group=g, async_op=a), a)
        return outs

    def all_to_all_single_even(g):
        t = data(name, n * W, dt)
        o = zeros(n * W, dt)
        settle(dist.all_to_all_single(o, t, group=g, async_op=a), a)
        return o

    # Uneven: group rank r sends (r + d + 1) * k elements to rank d.
    k = max(1, n // (2 * W * W))

    def all_to_all_single_uneven(g):
        me = g.rank()
        in_splits = [(me + d + 1) * k for d in range(W)]
        out_splits = [(s + me + 1) * k for s in range(W)]
        t = data(name, sum(in_splits), dt)
        o = zeros(sum(out_splits), dt)
        settle(dist.all_to_all_single(o, t, out_splits, in_splits, group=g, async_op=a), a)
        return o

    def gather(g):
        t = data(name, n, dt)
        dst = last
        outs = [zeros(n, dt) for _ in range(W)] if g.rank() == dst else None
        settle(dist.gather(t, outs, dst=gr(g, dst), group=g, async_op=a), a)
        return outs if outs is not None else []

    def scatter(g):
        src = 0
        ins = [data(name, n, dt, rank=gr(g, src), salt=i) for i in range(W)] if g.rank() == src else None
        o = zeros(n, dt)
        settle(dist.scatter(o, ins, src=gr(g, src), group=g, async_op=a), a)
        return o

    out += [
        ("broadcast", broadcast),
        ("reduce", reduce),
        ("reduce/MAX/root0", reduce_max_root0),
        ("all_reduce_coalesced", all_reduce_coalesced),
        ("all_gather", all_gather),
        ("all_gather_into_tensor", all_gather_into_tensor),
        ("all_gather_coalesced", all_gather_coalesced),
        ("reduce_scatter", reduce_scatter),
        ("reduce_scatter_tensor", reduce_scatter_tensor),
        ("all_to_all", all_to_all),
        ("all_to_all_single/even", all_to_all_single_even),
        ("all_to_all_single/uneven", all_to_all_single_uneven),
        ("gather", gather),
        ("scatter", scatter),
    ]
    return out
