"""frnccl subgroups against gloo subgroups over the same ranks (world size 4).

Usage: subgroups.py frnccl|gloo   (the backend of the default group)
  frnccl: default group frnccl; new_group([0, 2]) and new_group([1, 3]) take the
          default backend (frnccl), compared with gloo groups over the same ranks.
  gloo:   default group plain gloo; dist.new_group(backend="frnccl") over all
          ranks and over [0, 2] / [1, 3], compared with the default group and
          gloo subgroups.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from _ops import cases
from _worker import RANK, WORLD, Checks, finish, init

DEFAULT = sys.argv[1]
assert WORLD == 4, "subgroups.py needs 4 ranks"
init(DEFAULT)
checks = Checks()
checks.expect("default_backend", dist.get_backend() == DEFAULT, dist.get_backend())

# Every rank creates every group, in the same order.
if DEFAULT == "frnccl":
    fr_even, fr_odd = dist.new_group([0, 2]), dist.new_group([1, 3])
    fr_world = dist.new_group(backend="frnccl")
    gloo_world = dist.new_group(backend="gloo")
else:
    fr_world = dist.new_group(backend="frnccl")
    gloo_world = dist.group.WORLD
    fr_even, fr_odd = dist.new_group([0, 2], backend="frnccl"), dist.new_group([1, 3], backend="frnccl")
gloo_even, gloo_odd = dist.new_group([0, 2], backend="gloo"), dist.new_group([1, 3], backend="gloo")
fr_sub, gloo_sub = (fr_even, gloo_even) if RANK % 2 == 0 else (fr_odd, gloo_odd)

for name, g in [("fr_world", fr_world), ("fr_sub", fr_sub)]:
    checks.expect(f"get_backend/{name}", dist.get_backend(g) == "frnccl", dist.get_backend(g))
checks.expect("sub_size", fr_sub.size() == 2 and fr_sub.rank() == RANK // 2, f"{fr_sub.size()} {fr_sub.rank()}")

for label, fr, ref, size in [("sub", fr_sub, gloo_sub, 2), ("world", fr_world, gloo_world, WORLD)]:
    for dt in (torch.float32, torch.int64, torch.bfloat16):
        for a in (False, True):
            tag = f"{label}/{str(dt).replace('torch.', '')}/{'async' if a else 'sync'}"
            for op_name, fn in cases(tag, 1000, dt, a, size):
                checks.compare(f"{op_name}/{tag}", fn, ref, fr)

    def p2p(g):
        # Within the group: group rank 0 <-> 1, by global rank.
        peer = dist.get_global_rank(g, 1 - g.rank()) if g.rank() < 2 else None
        if peer is None:
            return []
        got = torch.zeros(100)
        mine = torch.arange(100, dtype=torch.float32) * (RANK + 1)
        if g.rank() == 0:
            dist.send(mine, dst=peer, group=g)
            dist.recv(got, src=peer, group=g)
        else:
            dist.recv(got, src=peer, group=g)
            dist.send(mine, dst=peer, group=g)
        return got

    checks.compare(f"send_recv/{label}", p2p, ref, fr)
    checks.compare(f"barrier/{label}", lambda g: dist.barrier(group=g) or [], ref, fr)

    def objects(g):
        objs = [None] * g.size()
        dist.all_gather_object(objs, ("rank", RANK), group=g)
        lst = [RANK * 10] if g.rank() == 0 else [None]
        dist.broadcast_object_list(lst, group_src=0, group=g)
        return [objs, lst]

    checks.compare(f"objects/{label}", objects, ref, fr)

finish(checks)
