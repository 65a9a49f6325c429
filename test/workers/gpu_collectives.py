"""Every collective and p2p op with CUDA tensors: frnccl (inner NCCL) against plain nccl.

One GPU per rank, chosen from LOCAL_RANK. Same cases as collectives.py.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

import _ops
from _ops import BIG, cases, data, zeros
from _worker import RANK, WORLD, Checks, finish, init

LOCAL = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(LOCAL)
_ops.DEVICE = torch.device("cuda", LOCAL)

init("frnccl")
FR = dist.group.WORLD
NCCL = dist.new_group(backend="nccl")
checks = Checks()
checks.expect("get_backend", dist.get_backend() == "frnccl", dist.get_backend())


def synced(fn):
    def run(g):
        out = fn(g)
        torch.cuda.synchronize()
        return out
    return run


# Fewer dtypes than the CPU suite: each case runs NCCL twice and synchronizes.
for dt in (torch.float32, torch.int64, torch.bfloat16):
    for n in (1, 1000, BIG):
        for a in (False, True):
            if n == BIG and (a and dt != torch.float32):
                continue
            tag = f"{str(dt).replace('torch.', '')}/n={n}/{'async' if a else 'sync'}"
            for name, fn in cases(tag, n, dt, a, WORLD):
                checks.compare(f"{name}/{tag}", synced(fn), NCCL, FR)

NEXT, PREV = (RANK + 1) % WORLD, (RANK - 1) % WORLD
for dt in (torch.float32, torch.int64, torch.bfloat16):
    for n in (1, 1000, BIG):
        tag = f"{str(dt).replace('torch.', '')}/n={n}"

        def send_recv(g, tag=tag, n=n, dt=dt):
            got = zeros(n, dt)
            # Unbatched NCCL p2p runs in issue order on one stream per pair: if
            # every rank posts its recv first, plain nccl deadlocks too (seen on
            # 2xH200 with test/workers/gpu_p2p_probe.py). Even ranks send first.
            if RANK % 2 == 0:
                works = [dist.isend(data(tag, n, dt), dst=NEXT, group=g), dist.irecv(got, src=PREV, group=g)]
            else:
                works = [dist.irecv(got, src=PREV, group=g), dist.isend(data(tag, n, dt), dst=NEXT, group=g)]
            for w in works:
                w.wait()
            torch.cuda.synchronize()
            return got

        def batch(g, tag=tag, n=n, dt=dt):
            bufs = [zeros(n, dt) for _ in range(2)]
            ops = [dist.P2POp(dist.isend, data(tag, n, dt, salt=1), NEXT, g),
                   dist.P2POp(dist.irecv, bufs[0], PREV, g),
                   dist.P2POp(dist.isend, data(tag, n, dt, salt=2), PREV, g),
                   dist.P2POp(dist.irecv, bufs[1], NEXT, g)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            torch.cuda.synchronize()
            return bufs

        checks.compare(f"isend_irecv/{tag}", send_recv, NCCL, FR)
        checks.compare(f"batch_isend_irecv/{tag}", batch, NCCL, FR)


def barrier(g):
    dist.barrier(group=NCCL)
    if RANK == 0:
        time.sleep(0.4)
    start = time.monotonic()
    dist.barrier(group=g)
    torch.cuda.synchronize()
    return RANK == 0 or time.monotonic() - start >= 0.25


checks.compare("barrier", barrier, NCCL, FR)


def objects(g):
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"r": RANK}, group=g)
    lst = [RANK * 3] if RANK == 0 else [None]
    dist.broadcast_object_list(lst, src=0, group=g)
    return [objs, lst]


checks.compare("objects", objects, NCCL, FR)

finish(checks)
