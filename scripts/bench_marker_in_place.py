#!/usr/bin/env python3
"""What a completion marker costs in place: between the synchronous all_reduces of a plain NCCL group.

    python scripts/bench_marker_in_place.py [--rounds 30] [--sizes 8,65536] [--iters 500] [--json FILE]

bench_markers.py times each CUDA primitive on its own (an untimed event record costs the caller about
0.5 µs there), while profiles of frnccl's paired benchmark put its per-op end event at 1-2.5 µs
(docs/benchmarks.md, ninth run). This script asks whether the difference is the event's or frnccl's: a
2-rank job of plain NCCL (torch's recorder off, no frnccl) runs blocks of synchronous all_reduces, each op
with one ctypes call beside it, and the arms differ only in that call:

  baseline              cudaGetLastError after each op (the ctypes call itself)
  event after           cuEventRecord of an untimed event on the current stream after each op, taking
                        64 events in turn, as frnccl's marker does
  stream query before   cudaStreamQuery on the current stream before each op: whether everything placed
                        on it so far has finished (it places nothing)
  timed events around   a timed event before and after each op (cuEventRecord, 64 pairs in turn): what
                        GPU timing of every op costs with CUDA events
  stamp kernels around  a one-thread kernel before and after each op that writes the GPU's
                        %globaltimer into mapped host memory (cuLaunchKernel, the kernel JIT-compiled
                        from PTX, 64 pairs of slots in turn): the same times without timed events

The two timing arms make two ctypes calls per op, the others one (about 0.2 µs more). After each of
their blocks the worker reads the last op's GPU duration both ways, so the report also says whether the
stamps measure what the events do.

Arms rotate within each round; the report gives, per size and arm, the median latency and calling-thread
CPU per op, and the median of the per-round differences against the baseline.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

from _jobs import human, parse_sizes, rank_envs, run_ranks
from bench_markers import CUDA_EVENT_DEFAULT, CUDA_EVENT_DISABLE_TIMING, StampKernel, check, create_events, loaded_library

RESULT = "IN_PLACE_RESULT "
ARMS = ("baseline", "event after", "stream query before", "timed events around", "stamp kernels around")
TIMING_ARMS = ("timed events around", "stamp kernels around")
PAIRS = 64
SCRUB = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_ENABLE_TIMING")


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method="env://", timeout=timedelta(seconds=120), device_id=device)
    cudart, libcuda = loaded_library("libcudart"), loaded_library("libcuda.so")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    events = create_events(cudart, 64, CUDA_EVENT_DISABLE_TIMING)
    record, query, last_error = libcuda.cuEventRecord, cudart.cudaStreamQuery, cudart.cudaGetLastError
    record.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    query.argtypes = [ctypes.c_void_p]
    turn = [0]

    def record_next() -> int:
        turn[0] = (turn[0] + 1) % len(events)
        return record(events[turn[0]], stream)

    timed = create_events(cudart, 2 * PAIRS, CUDA_EVENT_DEFAULT)
    timed_pairs = list(zip(timed[0::2], timed[1::2]))
    stamp = StampKernel(cudart, libcuda, stream, 2 * PAIRS)

    def last_duration_us(arm: str, pair: int) -> float:
        if arm == "timed events around":
            ms = ctypes.c_float()
            check("cudaEventElapsedTime", cudart.cudaEventElapsedTime(ctypes.byref(ms), *timed_pairs[pair]))
            return ms.value * 1000.0
        return (stamp.values[2 * pair + 1] - stamp.values[2 * pair]) / 1000.0

    def block(arm: str, t, iters: int) -> tuple[float, float]:
        dist.barrier()
        torch.cuda.synchronize()
        cpu0, t0 = time.thread_time(), time.perf_counter()
        if arm == "baseline":
            for _ in range(iters):
                dist.all_reduce(t)
                last_error()
        elif arm == "event after":
            for _ in range(iters):
                dist.all_reduce(t)
                record_next()
        elif arm == "stream query before":
            for _ in range(iters):
                query(stream)
                dist.all_reduce(t)
        elif arm == "timed events around":
            for i in range(iters):
                start, end = timed_pairs[i % PAIRS]
                record(start, stream)
                dist.all_reduce(t)
                record(end, stream)
        else:
            for i in range(iters):
                slot = 2 * (i % PAIRS)
                stamp(slot)
                dist.all_reduce(t)
                stamp(slot + 1)
        torch.cuda.synchronize()
        lat, cpu = (time.perf_counter() - t0) / iters * 1e6, (time.thread_time() - cpu0) / iters * 1e6
        if arm in TIMING_ARMS:
            gpu_us[arm].append(last_duration_us(arm, (iters - 1) % PAIRS))
        return lat, cpu

    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    gpu_us: dict[str, list[float]] = {arm: [] for arm in TIMING_ARMS}
    for size in args.sizes:
        t = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        for arm in ARMS:  # warm-up
            block(arm, t, args.iters)
        for durations in gpu_us.values():
            durations.clear()
        figures = {arm: {"lat": [], "cpu": []} for arm in ARMS}
        for r in range(args.rounds):
            order = ARMS[r % len(ARMS):] + ARMS[:r % len(ARMS)]
            for arm in order:
                lat, cpu = block(arm, t, args.iters)
                figures[arm]["lat"].append(lat)
                figures[arm]["cpu"].append(cpu)
        figures["gpu_us"] = {arm: list(durations) for arm, durations in gpu_us.items()}
        out[str(size)] = figures
    dist.barrier()
    if rank == 0:
        print(RESULT + json.dumps(out), flush=True)
    dist.destroy_process_group()


def report(results: dict, sizes: list[int]) -> str:
    lines = ["Per synchronous all_reduce, median µs over rounds; in brackets, the median of the per-round "
             "differences against the baseline", "",
             "| arm | " + " | ".join(f"{human(s)} latency | {human(s)} thread CPU" for s in sizes) + " |",
             "|" + " --- |" * (2 * len(sizes) + 1)]
    for arm in ARMS:
        cells = []
        for s in sizes:
            f = results[str(s)]
            for kind in ("lat", "cpu"):
                med = statistics.median(f[arm][kind])
                diff = statistics.median(b - a for a, b in zip(f["baseline"][kind], f[arm][kind]))
                cells.append(f"{med:.2f}" if arm == "baseline" else f"{med:.2f} ({diff:+.2f})")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += ["", "GPU duration of each block's last op, median µs over rounds [min-max]", "",
              "| arm | " + " | ".join(human(s) for s in sizes) + " |", "|" + " --- |" * (len(sizes) + 1)]
    for arm in TIMING_ARMS:
        values = [results[str(s)]["gpu_us"][arm] for s in sizes]
        lines.append(f"| {arm} | " + " | ".join(
            f"{statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]" for v in values) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30, help="rounds, each running every arm once (>= 3)")
    ap.add_argument("--sizes", default="", help="comma-separated byte counts (default 8,65536)")
    ap.add_argument("--iters", type=int, default=500, help="all_reduces per block (>= 10)")
    ap.add_argument("--json", default="", help="also write every raw figure here")
    ap.add_argument("--job-timeout", type=float, default=300)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes = parse_sizes(ap, args.sizes, [8, 64 * 1024])
    if args.worker:
        worker(args)
        return
    if args.rounds < 3 or args.iters < 10:
        ap.error(f"--rounds must be at least 3 and --iters at least 10; got {args.rounds} and {args.iters}")
    import torch

    if torch.cuda.device_count() < 2:
        raise SystemExit("bench_marker_in_place: needs 2 GPUs")
    envs = rank_envs(2, "/tmp", SCRUB, {"TORCH_FR_BUFFER_SIZE": "0"})
    cmd = [sys.executable, __file__, "--worker", "--rounds", str(args.rounds), "--iters", str(args.iters),
           "--sizes", ",".join(map(str, args.sizes))]
    started = time.time()
    results = run_ranks("bench_marker_in_place", cmd, envs, args.job_timeout, RESULT)
    print(f"plain nccl, 2 ranks, torch {torch.__version__}, {args.rounds} rounds x {args.iters} ops per arm, "
          f"{time.time() - started:.0f} s\n")
    print(report(results, args.sizes))
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": args.rounds, "iters": args.iters, "results": results}))


if __name__ == "__main__":
    main()
