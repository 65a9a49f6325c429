"""A training-like loop whose one rank becomes slow mid-run, for the slow-rank detector's tests and benchmark.

Each step every rank "computes" for STEP_MS (a sleep: many ranks share few cores), then runs the step's
collectives: SHAPE=flat, two all_reduces of the world (a DDP-like loop); SHAPE=mesh, a DeviceMesh-like
grid of MESH_TP columns: an all_reduce in the rank's tp group (its row), then one in its dp group (its
column). Steps are counted, so every rank agrees on the phases:
- steps [SLOW_FROM, SLOW_UNTIL): rank SLOW_RANK computes SLOW_FACTOR times as long (ALL_SLOW=1: every rank);
- step PAUSE_AT: rank PAUSE_RANK sleeps PAUSE_S once (a checkpoint, a GC);
- STEPS steps in all.
Rank 0 prints `PHASE slow`, `PHASE well` where the slow phase begins and ends and `T <s>` every second, so that
the lines of the detector (rank 0's stderr, in the same stream) can be placed in time.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


def main() -> int:
    dist.init_process_group("frnccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    step_s = env_int("STEP_MS", 40) / 1e3
    slow_rank, factor = env_int("SLOW_RANK", -1), float(os.environ.get("SLOW_FACTOR", "1.3"))
    slow_from, slow_until = env_int("SLOW_FROM", 10**9), env_int("SLOW_UNTIL", 10**9)
    all_slow = os.environ.get("ALL_SLOW") == "1"
    pause_rank, pause_at, pause_s = env_int("PAUSE_RANK", -1), env_int("PAUSE_AT", -1), float(os.environ.get("PAUSE_S", "0"))
    steps = env_int("STEPS", 500)
    groups: list[dist.ProcessGroup | None] = [None, None]
    if os.environ.get("SHAPE", "flat") == "mesh":
        tp = env_int("MESH_TP", 2)
        rows = [dist.new_group(list(range(r * tp, (r + 1) * tp))) for r in range(world // tp)]
        cols = [dist.new_group(list(range(c, world, tp))) for c in range(tp)]
        groups = [rows[rank // tp], cols[rank % tp]]
    grad = torch.ones(1024)
    start = last_tick = time.monotonic()
    for step in range(steps):
        if rank == 0:
            if step == slow_from:
                print("PHASE slow", flush=True)
            if step == slow_until:
                print("PHASE well", flush=True)
            if time.monotonic() - last_tick >= 1.0:
                last_tick = time.monotonic()
                print(f"T {last_tick - start:.1f}", flush=True)
        slow = slow_from <= step < slow_until and (all_slow or rank == slow_rank)
        time.sleep(step_s * (factor if slow else 1.0))
        if rank == pause_rank and step == pause_at:
            time.sleep(pause_s)
        for group in groups:
            dist.all_reduce(grad, group=group)
    dist.barrier()
    dist.destroy_process_group()
    print(f"DONE {rank} {time.monotonic() - start:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
