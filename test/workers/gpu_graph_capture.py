"""A CUDA graph captured while a synchronous op is in flight.

Rank 1 joins an all_reduce late. Meanwhile rank 0 captures a CUDA graph in the default (global) capture
mode, on a side stream, while the op is still running and the watchdogs poll its events. A query from
another thread in that mode is refused and invalidates the capture. So the capture must succeed and
replay correctly, and the op must not be seen as complete before rank 1 joined.

The same is done first on a plain nccl group, to show what torch's own watchdog does (a note, not a check).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from _worker import RANK, Checks, finish, init

LOCAL = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(LOCAL)
LATE_S = 2.0  # how late rank 1 joins
CAPTURE_S = 0.5  # how long rank 0's capture stays open: tens of watchdog polls

init("frnccl")
FR = dist.group.WORLD
NCCL = dist.new_group(backend="nccl")
checks = Checks()


def capture_while_in_flight(group) -> str:
    """Rank 0: issues the op, then captures a graph; '' if the capture worked and replayed right."""
    x = torch.ones(4, device="cuda")
    y = torch.zeros(4, device="cuda")
    side = torch.cuda.Stream()
    dist.barrier(group=group)
    torch.cuda.synchronize()
    if RANK == 1:
        time.sleep(LATE_S)
        dist.all_reduce(x, group=group)
        torch.cuda.synchronize()
        return ""
    dist.all_reduce(x, group=group)  # in flight until rank 1 joins
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(side):
            graph.capture_begin()
            try:
                y.add_(1.0)
                time.sleep(CAPTURE_S)
                y.add_(1.0)
            finally:
                graph.capture_end()
        graph.replay()
        torch.cuda.synchronize()
    except Exception as err:  # the capture was invalidated
        torch.cuda.synchronize()
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    if not torch.equal(y, torch.full((4,), 2.0, device="cuda")):
        return f"replay gave {y.tolist()}"
    return ""


plain_error = capture_while_in_flight(NCCL)
checks.notes["plain_nccl_capture"] = plain_error or "ok"
frnccl_error = capture_while_in_flight(FR)
if RANK == 0:
    checks.expect("capture_with_frnccl_op_in_flight", not frnccl_error, frnccl_error)
    time.sleep(0.2)  # a few watchdog polls: the op's completion is discovered
    import fr_backend

    entries = [e for e in fr_backend.trace_entries(symbolize=False)["entries"] if e["profiling_name"].endswith("all_reduce")]
    last = entries[-1]
    seen_after_s = (last["time_discovered_completed_ns"] - last["time_created_ns"]) / 1e9
    checks.notes["completion_seen_after_s"] = round(seen_after_s, 3)
    # Rank 1 joined LATE_S after the op was issued; an error taken for completion would show within the capture.
    checks.expect("not_completed_before_peer_joined", seen_after_s >= LATE_S / 2,
                  f"completion seen {seen_after_s:.3f} s after issue; rank 1 joined after {LATE_S} s")
finish(checks)
