#!/usr/bin/env python3
"""frnccl against the plain backend it wraps, both in the same processes: paired blocks, one job per config.

    python scripts/bench_paired.py [--mode cpu|gpu] [--configs default,gpu_timing=all,...]
                                   [--rounds 30] [--sizes 8,65536,...] [--json FILE]

Why a second benchmark beside bench_overhead.py: there every configuration is its own job, and two jobs
of the same configuration differ by up to ~20% at small sizes on the GPU host (process placement, clocks),
which is more than the few percent being asked about. Here each 2-rank job holds a plain group (gloo on
CPU, nccl on GPU; torch's flight recorder off in both, TORCH_FR_BUFFER_SIZE=0) and a frnccl group over the
same ranks and devices. Blocks of synchronous all_reduces alternate between them (A B, then B A) for
`--rounds` rounds, so both see the same machine state; each round gives a ratio frnccl/plain, and the
report is the median of those ratios with their interquartile range, plus the median time per op of each.
The same is done for the CPU enqueue cost of async all_reduces. A third table gives, for the synchronous
blocks, what they cost besides time: the calling thread's and the whole process's CPU per op, and the
calling thread's page faults and context switches, to tell time spent computing from time spent waiting.

frnccl fixes its configuration per process, so each frnccl configuration is its own job. The plain group
is created first (it is the default group), which is the case "a plain nccl group already exists" of
docs/design.md: torch's recorder is off in both groups because the job sets TORCH_FR_BUFFER_SIZE=0.
The frnccl watchdog keeps running while the plain group's blocks run, as it would in a real job.

`--block-log DIR` writes when each synchronous block ran (CLOCK_MONOTONIC, on which thread), one file per
configuration and rank, so that a profile of the job can be split by block: scripts/perf_by_block.py.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

from _jobs import human, parse_sizes, quartiles, rank_envs, run_paired_bench, run_ranks

RESULT = "PAIRED_RESULT "
CONFIGS: dict[str, dict[str, str]] = {
    "default": {},
    "end_events=1ms": {"FRNCCL_END_EVENT_INTERVAL_US": "1000"},
    "torch_watchdog=0": {"FRNCCL_SETTLE_BY_TORCH_WATCHDOG": "0"},
    "gpu_timing=all": {"FRNCCL_GPU_TIMING": "all"},
    "gpu_timing=16": {"FRNCCL_GPU_TIMING": "16"},
    "stacks=none": {"FRNCCL_STACKS": "none"},
    "buf=0": {"FRNCCL_BUFFER_SIZE": "0"},
}
CPU_SIZES = [8, 64 * 1024, 1024 * 1024]
GPU_SIZES = [8, 64 * 1024, 1024 * 1024, 64 * 1024 * 1024]
# Inherited settings that would change what is measured.
SCRUB = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_ENABLE_TIMING")


# What the synchronous blocks cost besides time, per op: the calling thread's CPU (µs), the whole
# process's CPU (µs: every thread, NCCL's and frnccl's included), both from the CPU-time clocks (getrusage's
# CPU times are coarser), and per 1000 ops the calling thread's minor page faults and context switches
# (voluntary and involuntary, from getrusage).
USAGE_SCALE = {"thread_cpu": 1e6, "process_cpu": 1e6, "thread_faults": 1e3, "thread_switches": 1e3}


def usage_now() -> dict[str, float]:
    thread = resource.getrusage(resource.RUSAGE_THREAD)
    return {"thread_cpu": time.thread_time(), "process_cpu": time.process_time(),
            "thread_faults": thread.ru_minflt, "thread_switches": thread.ru_nvcsw + thread.ru_nivcsw}


def iters_for(size: int, gpu: bool) -> int:
    if gpu:
        return 500 if size <= 64 * 1024 else 200 if size <= 1024 * 1024 else 20
    return 200 if size <= 64 * 1024 else 50


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import fr_backend  # noqa: F401  registers the backend

    gpu = args.mode == "gpu"
    rank = int(os.environ["RANK"])
    if gpu:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if gpu else "gloo", init_method="env://", timeout=timedelta(seconds=120))
    plain = dist.group.WORLD
    wrapped = dist.new_group(backend="frnccl")

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    blocks: list[dict] = []  # for --block-log

    def latency(group, t, iters: int, costs: dict[str, float] | None = None) -> float:
        dist.barrier(group=plain)
        sync()
        before = usage_now()
        start_ns = time.monotonic_ns()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, group=group)
        sync()
        elapsed = time.perf_counter() - t0
        if costs is not None:  # a measured block, not a warm-up
            end_ns = time.monotonic_ns()
            after = usage_now()
            blocks.append({"arm": "plain" if group is plain else "frnccl", "size": t.numel() * t.element_size(),
                           "iters": iters, "start_ns": start_ns, "end_ns": end_ns})
            costs.update({k: (after[k] - before[k]) / iters * USAGE_SCALE[k] for k in after})
        return elapsed / iters * 1e6

    def enqueue(group, t, iters: int) -> float:
        dist.barrier(group=plain)
        sync()
        t0 = time.perf_counter()
        works = [dist.all_reduce(t, group=group, async_op=True) for _ in range(iters)]
        elapsed = time.perf_counter() - t0
        for w in works:
            w.wait()
        sync()
        # The block's Works are freed before any timed block, in both arms: the plain group's here, as
        # Python lets go of them; frnccl's, which its watchdog holds until it has seen them complete and
        # which the group's next op then frees, by an untimed barrier on the group after a watchdog poll.
        # Freed by the next timed block instead, they would charge it one Work's destruction per op
        # (1.3-1.5 µs, perf_by_block.py), a cost the plain group pays as well, only outside the blocks.
        del works
        time.sleep(0.03)
        dist.barrier(group=group)
        sync()
        return elapsed / iters * 1e6

    out: dict[str, dict[str, list[float]]] = {}
    for size in args.sizes:
        t = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        iters = iters_for(size, gpu)
        for group in (plain, wrapped):  # warm-up: connections, allocator, recorder slots
            latency(group, t, iters)
        figures: dict[str, list[float]] = {f"{name}_{kind}": [] for name in ("plain", "frnccl")
                                           for kind in ("lat", "enq", *USAGE_SCALE)}
        for r in range(args.rounds):
            order = ((plain, "plain"), (wrapped, "frnccl")) if r % 2 == 0 else ((wrapped, "frnccl"), (plain, "plain"))
            for group, name in order:
                costs: dict[str, float] = {}
                figures[f"{name}_lat"].append(latency(group, t, iters, costs))
                for kind, value in costs.items():
                    figures[f"{name}_{kind}"].append(value)
            for group, name in order:
                figures[f"{name}_enq"].append(enqueue(group, t, iters))
        out[str(size)] = figures
    dist.barrier(group=plain)
    if args.block_log:
        header = {"pid": os.getpid(), "tid": threading.get_native_id(), "rank": rank}
        Path(args.block_log).mkdir(parents=True, exist_ok=True)
        Path(args.block_log, f"rank{rank}.jsonl").write_text("".join(json.dumps({**header, **b}) + "\n" for b in blocks))
    if rank == 0:
        print(RESULT + json.dumps(out), flush=True)
    dist.destroy_process_group()


def run_job(config: str, args: argparse.Namespace, dump_dir: str) -> dict:
    envs = rank_envs(2, dump_dir, SCRUB, {"TORCH_FR_BUFFER_SIZE": "0", **CONFIGS[config]})
    cmd = [sys.executable, __file__, "--worker", "--mode", args.mode, "--rounds", str(args.rounds),
           "--sizes", ",".join(map(str, args.sizes))]
    if args.block_log:
        cmd += ["--block-log", str(Path(args.block_log, config))]
    return run_ranks(f"bench_paired: {config}", cmd, envs, args.job_timeout, RESULT)


def report(results: dict[str, dict], sizes: list[int], kind: str, title: str) -> str:
    lines = [f"{title}: frnccl/plain, median of per-round ratios [interquartile range]; "
             "median us/op plain -> frnccl", "",
             "| frnccl configuration | " + " | ".join(human(s) for s in sizes) + " |",
             "|" + " --- |" * (len(sizes) + 1)]
    for config, per_size in results.items():
        cells = []
        for s in sizes:
            f = per_size[str(s)]
            ratios = [b / a for a, b in zip(f[f"plain_{kind}"], f[f"frnccl_{kind}"])]
            q1, q2, q3 = quartiles(ratios)
            cells.append(f"x{q2:.3f} [{q1:.3f}-{q3:.3f}]; "
                         f"{statistics.median(f[f'plain_{kind}']):.2f} -> {statistics.median(f[f'frnccl_{kind}']):.2f}")
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report_usage(results: dict[str, dict], sizes: list[int]) -> str:
    lines = ["Besides time, per synchronous all_reduce: median over rounds, plain -> frnccl (median of the "
             "per-round differences); faults and switches per 1000 ops", "",
             "| frnccl configuration | measure | " + " | ".join(human(s) for s in sizes) + " |",
             "|" + " --- |" * (len(sizes) + 2)]
    labels = {"thread_cpu": "calling thread CPU, µs", "process_cpu": "process CPU, µs",
              "thread_faults": "calling thread minor faults", "thread_switches": "calling thread context switches"}
    for config, per_size in results.items():
        for kind, label in labels.items():
            cells = []
            for s in sizes:
                f = per_size[str(s)]
                if not f.get(f"plain_{kind}"):
                    cells.append("-")
                    continue
                paired = statistics.median(b - a for a, b in zip(f[f"plain_{kind}"], f[f"frnccl_{kind}"]))
                cells.append(f"{statistics.median(f[f'plain_{kind}']):.2f} -> {statistics.median(f[f'frnccl_{kind}']):.2f}"
                             f" ({paired:+.2f})")
            lines.append(f"| {config} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--configs", default="default,gpu_timing=all",
                    help=f"comma-separated frnccl configurations, from: {', '.join(CONFIGS)}")
    ap.add_argument("--rounds", type=int, default=30, help="A/B rounds per size (>= 4)")
    ap.add_argument("--sizes", default="", help="comma-separated byte counts")
    ap.add_argument("--json", default="", help="also write every raw figure here")
    ap.add_argument("--block-log", default="", help="write when each synchronous block ran into this folder "
                    "(one subfolder per configuration), for scripts/perf_by_block.py")
    ap.add_argument("--job-timeout", type=float, default=300)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes = parse_sizes(ap, args.sizes, GPU_SIZES if args.mode == "gpu" else CPU_SIZES)
    if args.worker:
        worker(args)
        return
    _, results = run_paired_bench(ap, args, "bench_paired", CONFIGS, run_job)
    print(report(results, args.sizes, "lat", "Latency per synchronous all_reduce"))
    print()
    print(report(results, args.sizes, "enq", "CPU enqueue cost per async all_reduce"))
    print()
    print(report_usage(results, args.sizes))
    if args.json:
        Path(args.json).write_text(json.dumps({"mode": args.mode, "rounds": args.rounds, "results": results}))


if __name__ == "__main__":
    main()
