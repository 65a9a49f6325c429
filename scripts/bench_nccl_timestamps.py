#!/usr/bin/env python3
"""What NCCL's own kernel timestamps cost plain nccl: its profiler plugin interface, kernel-channel events on and off.

    python3 scripts/bench_nccl_timestamps.py [--rounds 15] [--sizes 8,65536,1048576,67108864] [--json FILE]

Why: GPU timing with CUDA events costs 5-10 µs of CPU and 6 µs of GPU time per op (docs/design.md, "Why
timing is not on by default"). NCCL can time its own kernels instead: a profiler plugin that enables
kernel-channel events gets, for each channel of each collective's kernel, its GPU start and stop
(globaltimer, ns). The plugin here uses version 4 of NCCL's profiler interface (NCCL 2.26 and later). This measures what that costs plain nccl before anything is recorded, and whether
the timestamps are usable.

How: the script compiles nccl_timestamps_plugin.c (beside it) with the C compiler ($CC, default cc) into a
temporary folder and runs one 2-rank job with NCCL_PROFILER_PLUGIN pointing at it and torch's recorder
off. NCCL's event mask is one for the whole process, and the plugin lets the job set it, so blocks of
synchronous all_reduces on one nccl group alternate between three arms: no events (the plugin loaded),
collective events only, and collective plus kernel-channel events. Each round rotates the arms' order; the
report gives, per size, the median over rounds of each arm's time per op over the first arm's, with the
interquartile range. Then it reads back the newest collectives' GPU durations (last channel's stop minus
first channel's start), how many channels they ran on, and where NCCL called the plugin from.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _jobs import human, parse_sizes, quartiles, rank_envs, run_ranks

RESULT = "TIMESTAMPS_RESULT "
PLUGIN_SOURCE = Path(__file__).with_name("nccl_timestamps_plugin.c")
EVENT_COLL = 1 << 1
EVENT_KERNEL_CHANNEL = 1 << 6
ARMS = {"no events": 0, "collective events": EVENT_COLL, "+ kernel-channel events": EVENT_COLL | EVENT_KERNEL_CHANNEL}
DEFAULT_SIZES = [8, 64 * 1024, 1024 * 1024, 64 * 1024 * 1024]
SCRUB = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_ENABLE_TIMING", "NCCL_PROFILER_PLUGIN")
COUNT_NAMES = ("communicators", "collectives", "collectives_on_calling_thread", "channels_started",
               "channels_stopped", "channels_without_collective")


def iters_for(size: int) -> int:
    return 30 if size >= 16 * 1024 * 1024 else 300


def load_plugin(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)  # the same object NCCL opened: one path, one load
    lib.bench_set_event_mask.argtypes = [ctypes.c_int]
    lib.bench_set_calling_thread.argtypes = [ctypes.c_int]
    return lib


def newest(lib: ctypes.CDLL, n: int) -> tuple[list[int], list[int], list[int]]:
    durations, channels, lags = (ctypes.c_int64 * n)(), (ctypes.c_int64 * n)(), (ctypes.c_int64 * n)()
    found = lib.bench_newest_collectives(durations, channels, n)
    found_lags = lib.bench_newest_stop_lags(lags, n)
    return list(durations[:found]), list(channels[:found]), list(lags[:found_lags])


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    lib = load_plugin(os.environ["NCCL_PROFILER_PLUGIN"])
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    lib.bench_set_calling_thread(threading.get_native_id())
    t0 = torch.ones(1, device="cuda")
    dist.all_reduce(t0)  # the communicator exists from here on
    torch.cuda.synchronize()
    if lib.bench_set_event_mask(0) != 0:
        raise SystemExit("NCCL did not initialize the profiler plugin (it needs NCCL 2.26 or later)")

    out: dict[str, dict] = {}
    for size in args.sizes:
        t = torch.ones(max(2, size // 4), device="cuda")
        iters = iters_for(size)
        per_arm: dict[str, list[float]] = {arm: [] for arm in ARMS}
        names = list(ARMS)
        for r in range(args.rounds + 1):  # round 0 warms every arm up and is not kept
            for arm in names[r % len(names):] + names[:r % len(names)]:
                lib.bench_set_event_mask(ARMS[arm])
                dist.all_reduce(t)
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(t)
                torch.cuda.synchronize()
                if r:
                    per_arm[arm].append((time.perf_counter() - start) / iters * 1e6)
        lib.bench_set_event_mask(EVENT_COLL | EVENT_KERNEL_CHANNEL)
        for _ in range(50):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        time.sleep(0.2)  # NCCL's proxy thread reports the last channels after the kernels end
        lib.bench_set_event_mask(0)
        durations, channels, lags = newest(lib, 40)
        out[str(size)] = {"us": per_arm, "gpu_durations_ns": durations, "channels": channels, "stop_lags_ns": lags}
    counts = (ctypes.c_int64 * len(COUNT_NAMES))()
    lib.bench_counts(counts)
    dist.barrier()
    if rank == 0:
        print(RESULT + json.dumps({"sizes": out, "counts": dict(zip(COUNT_NAMES, counts)),
                                   "torch": torch.__version__,
                                   "nccl": ".".join(map(str, torch.cuda.nccl.version()))}), flush=True)
    dist.destroy_process_group()


def build_plugin(folder: str) -> str:
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        raise SystemExit(f"bench_nccl_timestamps: no C compiler {compiler!r} on PATH (set CC)")
    target = os.path.join(folder, "libnccl-profiler-frnccl-bench.so")
    built = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", target, str(PLUGIN_SOURCE)],
                           capture_output=True, text=True)
    if built.returncode != 0:
        raise SystemExit(f"bench_nccl_timestamps: {compiler} could not build {PLUGIN_SOURCE.name}: "
                         f"{built.stderr.strip().splitlines()[-1] if built.stderr.strip() else built.returncode}")
    return target


def report(result: dict, sizes: list[int]) -> str:
    arms = list(ARMS)
    lines = [f"torch {result['torch']}, NCCL {result['nccl']}, 2 ranks; time per synchronous all_reduce, "
             f"arm / '{arms[0]}': median of per-round ratios [interquartile range]; median us/op", "",
             "| arm | " + " | ".join(human(s) for s in sizes) + " |", "|" + " --- |" * (len(sizes) + 1)]
    for arm in arms:
        cells = []
        for s in sizes:
            per_arm = result["sizes"][str(s)]["us"]
            ratios = [a / b for a, b in zip(per_arm[arm], per_arm[arms[0]])]
            q1, q2, q3 = quartiles(ratios)
            cells.append(f"x{q2:.3f} [{q1:.3f}-{q3:.3f}]; {statistics.median(per_arm[arm]):.1f}")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += ["", "What the kernel-channel events reported (newest 40 collectives of each size):", "",
              "| size | collectives with all channels stopped | channels | GPU duration, median us | "
              "host wall clock at the stop callback minus GPU stop, median [min] us |",
              "| --- | --- | --- | --- | --- |"]
    for s in sizes:
        r = result["sizes"][str(s)]
        lags = r["stop_lags_ns"]
        lines.append(f"| {human(s)} | {len(r['gpu_durations_ns'])} | {sorted(set(r['channels']))} | "
                     f"{statistics.median(r['gpu_durations_ns']) / 1e3:.2f} | "
                     f"{statistics.median(lags) / 1e3:.1f} [{min(lags) / 1e3:.1f}] |"
                     if r["gpu_durations_ns"] and lags else f"| {human(s)} | 0 | - | - | - |")
    lines += ["", "Plugin calls: " + ", ".join(f"{k} {v}" for k, v in result["counts"].items())]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--sizes", default="", help="comma-separated byte counts (default 8,65536,1048576,67108864)")
    ap.add_argument("--json", help="write the raw figures here")
    ap.add_argument("--job-timeout", type=float, default=300.0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes = parse_sizes(ap, args.sizes, DEFAULT_SIZES)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.worker:
        worker(args)
        return
    import torch

    if torch.cuda.device_count() < 2:
        raise SystemExit(f"bench_nccl_timestamps: needs 2 CUDA GPUs; this machine has {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory(prefix="frnccl-bench-") as folder:
        plugin = build_plugin(folder)
        envs = rank_envs(2, folder, SCRUB, {"TORCH_FR_BUFFER_SIZE": "0", "NCCL_PROFILER_PLUGIN": plugin})
        cmd = [sys.executable, __file__, "--worker", "--rounds", str(args.rounds),
               "--sizes", ",".join(map(str, args.sizes))]
        print(f"bench_nccl_timestamps: {args.rounds} rounds of {len(ARMS)} arms at "
              f"{', '.join(human(s) for s in args.sizes)} ...", file=sys.stderr, flush=True)
        result = run_ranks("bench_nccl_timestamps", cmd, envs, args.job_timeout, RESULT)
    print(report(result, args.sizes))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
