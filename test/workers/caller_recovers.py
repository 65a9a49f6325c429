"""Calls a training loop makes and recovers from, on CPU tensors of an frnccl group.

- A coalescing block on CPU: Gloo cannot coalesce, so frnccl runs the block's ops one by one, and the
  Work torch keeps for the block (endCoalescing's) must wait for all of them. Rank 1 enters late, so
  rank 0's wait() has something to wait for.
- An op Gloo refuses while running it (a bitwise reduce on floats), waited for after the group's timeout:
  the caller gets gloo's own error, as without frnccl, not a timeout named after the late wait.
- An op that torch refuses before it is issued (broadcast from a rank outside the group), caught by rank 0
  only: rank 0's later ops must keep the seqs of rank 1's, and the refused op must not be in the record.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from _worker import RANK, WORLD, Checks, finish, init

LATE_S = 1.0

init("frnccl")
checks = Checks()

a, b = torch.ones(4), torch.full((4,), 2.0)
if RANK == 1:
    time.sleep(LATE_S)
with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
    dist.all_reduce(a)
    dist.all_reduce(b)
cm.wait()
checks.expect("coalesced_all_reduce_waited", bool((a == WORLD).all() and (b == 2.0 * WORLD).all()),
              f"after wait(): {a.tolist()} {b.tolist()}")

peer = 1 - RANK
got = torch.zeros(3)
if RANK == 1:
    time.sleep(LATE_S)
with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
    dist.isend(torch.full((3,), float(RANK + 10)), peer)
    dist.irecv(got, peer)
cm.wait()
checks.expect("coalesced_p2p_waited", bool((got == peer + 10).all()), f"after wait(): {got.tolist()}")

late_groups = {name: dist.new_group(backend=name, timeout=timedelta(seconds=1)) for name in ("gloo", "frnccl")}


def band_on_floats_waited_late(group: dist.ProcessGroup) -> torch.Tensor:
    t = torch.ones(4)
    work = dist.all_reduce(t, op=dist.ReduceOp.BAND, group=group, async_op=True)
    time.sleep(1.5)
    work.wait()
    return t


checks.compare("refused_while_running_waited_late", band_on_floats_waited_late, late_groups["gloo"],
               late_groups["frnccl"])

if RANK == 0:
    try:
        dist.broadcast(torch.ones(2), src=WORLD + 5)
        checks.fail("refused_broadcast", "torch accepted a root outside the group")
    except Exception as err:  # noqa: BLE001 - the training loop's own recovery
        checks.notes["refused_with"] = type(err).__name__
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
checks.expect("all_reduce_after_refusal", bool((t == WORLD ** 3).all()), str(t.tolist()))

import fr_backend  # noqa: E402

entries = fr_backend.trace_entries(symbolize=False)["entries"]
checks.notes["collectives"] = [(e["profiling_name"], e["collective_seq_id"]) for e in entries if not e["is_p2p"]]
checks.notes["p2p_seqs"] = [e["p2p_seq_id"] for e in entries if e["is_p2p"]]
finish(checks)
