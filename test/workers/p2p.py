"""Point-to-point through frnccl (default group) against plain gloo over the same ranks.

send/recv, isend/irecv, recv from any source (src=None), batch_isend_irecv;
several dtypes and sizes.
"""

from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

from _worker import RANK, WORLD, Checks, finish, init

init("frnccl")
FR = dist.group.WORLD
GLOO = dist.new_group(backend="gloo")
checks = Checks()

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16, torch.uint8]
SIZES = [1, 1000, 1 << 20]


def data(name: str, numel: int, dtype: torch.dtype, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(f"{name}/{rank}".encode()))
    if dtype.is_floating_point:
        return (torch.rand(numel, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)
    return torch.randint(0, 100, (numel,), generator=g, dtype=dtype)


NEXT, PREV = (RANK + 1) % WORLD, (RANK - 1) % WORLD

for dt in DTYPES:
    for n in SIZES:
        if n == SIZES[-1] and dt not in (torch.float32, torch.int64):
            continue
        tag = f"{str(dt).replace('torch.', '')}/n={n}"

        def send_recv(g, tag=tag, n=n, dt=dt):
            # Ring in two phases (even ranks send first) so blocking calls cannot deadlock.
            got = torch.zeros(n, dtype=dt)
            mine = data(tag, n, dt, RANK)
            if RANK % 2 == 0:
                dist.send(mine, dst=NEXT, group=g)
                dist.recv(got, src=PREV, group=g)
            else:
                dist.recv(got, src=PREV, group=g)
                dist.send(mine, dst=NEXT, group=g)
            return got

        def isend_irecv(g, tag=tag, n=n, dt=dt):
            got = torch.zeros(n, dtype=dt)
            works = [dist.irecv(got, src=PREV, group=g, tag=7), dist.isend(data(tag, n, dt, RANK), dst=NEXT, group=g, tag=7)]
            for w in works:
                w.wait()
            return got

        def batch(g, tag=tag, n=n, dt=dt):
            ops, outs = [], []
            for peer in range(WORLD):
                if peer == RANK:
                    continue
                buf = torch.zeros(n, dtype=dt)
                outs.append(buf)
                ops.append(dist.P2POp(dist.isend, data(f"{tag}/{peer}", n, dt, RANK), peer, g))
                ops.append(dist.P2POp(dist.irecv, buf, peer, g))
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            return outs

        checks.compare(f"send_recv/{tag}", send_recv, GLOO, FR)
        checks.compare(f"isend_irecv/{tag}", isend_irecv, GLOO, FR)
        checks.compare(f"batch_isend_irecv/{tag}", batch, GLOO, FR)


def any_source(g, a: bool):
    """Every other rank sends to rank 0, which receives with src=None: who sent what."""
    n = 257
    dist.barrier(group=GLOO)  # rounds must not overlap: a later round's send could match this recv
    if RANK == 0:
        got = {}
        for _ in range(WORLD - 1):
            buf = torch.zeros(n, dtype=torch.float32)
            if a:
                w = dist.irecv(buf, src=None, group=g)
                w.wait()
                sender = w._source_rank()
            else:
                sender = dist.recv(buf, src=None, group=g)
            got[sender] = buf
        dist.barrier(group=GLOO)
        return [sorted(got)] + [got[k] for k in sorted(got)]
    dist.send(data("any", n, torch.float32, RANK), dst=0, group=g)
    dist.barrier(group=GLOO)
    return []


checks.compare("recv_any_source/sync", lambda g: any_source(g, False), GLOO, FR)
checks.compare("recv_any_source/async", lambda g: any_source(g, True), GLOO, FR)
if RANK == 0:
    # The senders must be exactly the other ranks (not only "the same as gloo").
    senders = any_source(FR, False)[0]
    checks.expect("recv_any_source/senders", senders == list(range(1, WORLD)), f"senders {senders}")
else:
    any_source(FR, False)

finish(checks)
