#!/usr/bin/env python3
"""Per-op all_reduce overhead of frnccl against the plain backend it wraps.

Design
  * Every configuration runs as its own job (its own set of rank processes): torch reads
    TORCH_FR_BUFFER_SIZE once per process, and frnccl fixes its configuration with the first
    group, so configurations cannot share a process.
  * Jobs are interleaved A/B/C/... and the whole round is repeated (--repeats, >= 5 for a
    report); each figure is the median over repeats, each ratio is against the baseline's median.
    Two jobs of one configuration can differ by more than the gaps asked about (20-60% at small
    sizes on the GPU host); --turns is the comparison to quote there.
  * --turns: every configuration's job runs at once, and they take turns, one block each per round
    and size; the report is the median of per-round ratios (_turns.py says how, and why the GPU
    mode pins the ranks' threads: _placement.py).
  * Inside a job, for every size: warm-up, then `blocks` blocks of `iters` synchronous
    all_reduces (latency = block time / iters; the job reports the median block), then the CPU
    enqueue cost: the time to issue `iters` async all_reduces (async_op=True), divided by iters,
    measured before waiting on them.

Modes
  --mode cpu  (default) world size 2, gloo vs frnccl on CPU tensors, sizes 8 B, 64 KB, 1 MB.
              Configurations: gloo (baseline), frnccl (default: 20000 entries, python stacks),
              frnccl FRNCCL_BUFFER_SIZE=0 (recorder off), frnccl FRNCCL_STACKS=none.
              frnccl - frnccl[buf=0] is the recorder's own cost per op; frnccl - frnccl[stacks=none]
              is the caller-stack capture's share of it.
  --mode gpu  needs CUDA with >= 2 GPUs (one with --world 1); world size = --world (default 2), sizes 8 B, 64 KB,
              1 MB, 64 MB. Configurations: nccl with TORCH_FR_BUFFER_SIZE=0 (baseline), nccl with
              torch's flight recorder at its default size, torch FR + TORCH_NCCL_ENABLE_TIMING=1,
              frnccl (default), frnccl with FRNCCL_GPU_TIMING=all. Latency is taken with
              torch.cuda.synchronize() around each block. Attribution configurations, chosen
              with --configs: frnccl[stacks=none], frnccl[buf=0] (recorder off).

usage:
  python scripts/bench_overhead.py                 # CPU, 5 repeats
  python scripts/bench_overhead.py --quick         # CPU, 2 repeats, fewer iterations (smoke test)
  python scripts/bench_overhead.py --mode gpu      # GPU machine, >= 2 GPUs
  python scripts/bench_overhead.py --mode gpu --world 1   # one GPU, one rank per job
  python scripts/bench_overhead.py --json out.json # also write every raw figure (after every job)
  python scripts/bench_overhead.py --mode gpu --turns --rounds 40   # jobs taking turns: per-round ratios
  python scripts/bench_overhead.py --poll-status   # frnccl against frnccl asked `frnccl status` once a second
                                                   # (scripts/_status_poll.py; not with --turns)

The recorder's own cost per op, free of the network's noise (a few hundred nanoseconds, far below
what these jobs can resolve on a shared machine), is measured by scripts/bench_wrapper.py: frnccl
around torch's FakeProcessGroup, per configuration (FRNCCL_STACKS=none, FRNCCL_BUFFER_SIZE=0).

Entry size: backend/Recorder.cpp has static_assert(sizeof(Entry) <= 512); --entry-size compiles
a tiny probe against the installed torch headers (needs a C++ compiler) and prints sizeof(Entry).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _turns
from _jobs import human, parse_names, parse_sizes, rank_envs, run_ranks, size_table
from _placement import rank_placements
from _status_poll import StatusPoller

ROOT = Path(__file__).resolve().parents[1]
RESULT = "BENCH_RESULT "

CPU_SIZES = [8, 64 * 1024, 1024 * 1024]
GPU_SIZES = [8, 64 * 1024, 1024 * 1024, 64 * 1024 * 1024]

# Set in a job's environment: the worker also creates an frnccl group and never uses it.
IDLE_FRNCCL_GROUP = "BENCH_IDLE_FRNCCL_GROUP"
# Set in a job's environment: the driver asks the job for `frnccl status` once a second while it runs (the
# ranks ignore it).
POLL_STATUS = "BENCH_POLL_STATUS"
# name -> (backend, extra env); the first entry is the baseline.
CPU_CONFIGS = {
    "gloo": ("gloo", {}),
    "frnccl": ("frnccl", {}),
    "frnccl[buf=0]": ("frnccl", {"FRNCCL_BUFFER_SIZE": "0"}),
    "frnccl[stacks=none]": ("frnccl", {"FRNCCL_STACKS": "none"}),
    "frnccl[status 1/s]": ("frnccl", {POLL_STATUS: "1"}),
    # The slow-rank detector on: its thread, and the completion dating in every CPU op's wait().
    "frnccl[slow=1]": ("frnccl", {"FRNCCL_SLOW_DETECT": "1"}),
}
CPU_DEFAULT_CONFIGS = ["gloo", "frnccl", "frnccl[buf=0]", "frnccl[stacks=none]"]
GPU_CONFIGS = {
    "nccl[FR=0]": ("nccl", {"TORCH_FR_BUFFER_SIZE": "0"}),
    "nccl[FR default]": ("nccl", {}),
    "nccl[FR+timing]": ("nccl", {"TORCH_NCCL_ENABLE_TIMING": "1"}),
    "frnccl": ("frnccl", {}),
    "frnccl[gpu_timing=all]": ("frnccl", {"FRNCCL_GPU_TIMING": "all"}),
    # Sampled timing, one op in 16: durations at a sixteenth of the cost of timing every op.
    "frnccl[gpu_timing=16]": ("frnccl", {"FRNCCL_GPU_TIMING": "16"}),
    # Attribution (pick with --configs): what each part of frnccl's op path costs.
    "frnccl[stacks=none]": ("frnccl", {"FRNCCL_STACKS": "none"}),
    "frnccl[buf=0]": ("frnccl", {"FRNCCL_BUFFER_SIZE": "0"}),
    # What frnccl's presence costs plain nccl: an frnccl group (its threads and inner groups) that is never used.
    "nccl[FR=0]+idle frnccl": ("nccl", {"TORCH_FR_BUFFER_SIZE": "0", IDLE_FRNCCL_GROUP: "1"}),
    "frnccl[status 1/s]": ("frnccl", {POLL_STATUS: "1"}),
    "frnccl[slow=1]": ("frnccl", {"FRNCCL_SLOW_DETECT": "1"}),
}
# frnccl's goals also compare it with torch's own recorder at the same level of detail.
TORCH_COUNTERPARTS = [("frnccl", "nccl[FR default]"), ("frnccl[gpu_timing=all]", "nccl[FR+timing]")]
GPU_DEFAULT_CONFIGS = ["nccl[FR=0]", "nccl[FR default]", "nccl[FR+timing]", "frnccl", "frnccl[gpu_timing=all]"]
# Settings that would change what a configuration measures if inherited from the caller's env.
SCRUB = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_ENABLE_TIMING")


def iters_for(size: int, quick: bool) -> int:
    n = 2000 if size <= 8 else 1000 if size <= 64 * 1024 else 200 if size <= 1024 * 1024 else 20
    return max(10, n // 5) if quick else n


# ---------------------------------------------------------------------------------------------
# worker: one rank of one configuration
# ---------------------------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from datetime import timedelta

    rank = int(os.environ["RANK"])
    gpu = args.mode == "gpu"
    if gpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(args.backend, init_method="env://", timeout=timedelta(seconds=300),
                                device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group(args.backend, init_method="env://", timeout=timedelta(seconds=300))

    if os.environ.get(IDLE_FRNCCL_GROUP) == "1":
        dist.new_group(backend="frnccl")  # kept, unused, until destroy_process_group

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    out = {}
    for size in args.sizes:
        numel = max(1, size // 4)
        t = torch.ones(numel, dtype=torch.float32, device=device)
        iters = iters_for(size, args.quick)
        for _ in range(max(5, iters // 10)):  # warm-up (connections, allocator, recorder slots)
            dist.all_reduce(t)
        sync()
        blocks = []
        for _ in range(args.blocks):
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            sync()
            blocks.append((time.perf_counter() - t0) / iters * 1e6)
        dist.barrier()
        sync()
        works = []
        t0 = time.perf_counter()
        for _ in range(iters):
            works.append(dist.all_reduce(t, async_op=True))
        enqueue = (time.perf_counter() - t0) / iters * 1e6
        for w in works:
            w.wait()
        sync()
        out[str(size)] = {"lat_us": statistics.median(blocks), "enqueue_us": enqueue, "iters": iters}
    dist.barrier()
    if rank == 0:
        print(RESULT + json.dumps(out), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------


def run_job(name: str, backend: str, extra: dict[str, str], args: argparse.Namespace, dump_dir: str) -> dict:
    envs = rank_envs(args.world, dump_dir, SCRUB, extra)
    cmd = [sys.executable, __file__, "--worker", "--backend", backend, "--mode", args.mode,
           "--sizes", ",".join(map(str, args.sizes)), "--blocks", str(args.blocks)] + (["--quick"] if args.quick else [])
    if extra.get(POLL_STATUS) != "1":
        return run_ranks(name, cmd, envs, args.job_timeout, RESULT)
    # Polled from the job's start to its end: the measured phase is inside.
    with StatusPoller(int(envs[0]["MASTER_PORT"]), args.world) as poller:
        out = run_ranks(name, cmd, envs, args.job_timeout, RESULT)
    print(f"  {name}: status {poller.stats.line()}", file=sys.stderr, flush=True)
    if poller.stats.full == 0:
        raise SystemExit(f"{name}: no status request was answered by every rank: the job was not polled")
    return out


def table(configs: list[str], sizes: list[int], runs: dict[str, list[dict]], key: str, title: str) -> str:
    base = configs[0]
    med = {c: {s: statistics.median(r[str(s)][key] for r in runs[c]) for s in sizes} for c in configs}

    def cell(row: list[str], s: int) -> str:
        c = row[0]
        values = [r[str(s)][key] for r in runs[c]]
        text = f"{med[c][s]:.1f} [{min(values):.1f}-{max(values):.1f}]"
        return text if c == base else text + f" x{med[c][s] / med[base][s]:.2f}"

    return "\n".join(size_table(f"{title} (median over {len(runs[base])} repeats, us/op; [min-max]; x = ratio to {base})",
                                ["configuration"], [[c] for c in configs], sizes, cell))


def ratio_table(pairs: list[tuple[str, str]], sizes: list[int], runs: dict[str, list[dict]]) -> str:
    """Latency of each configuration against another's job of the same repeat (a repeat's jobs run back to back)."""
    repeats = min(len(v) for v in runs.values())
    lines = [f"Latency / the other configuration's job in the same repeat: median [min-max] over {repeats} repeats, "
             "and how many were above 1", "", "| configuration | against | " + " | ".join(human(s) for s in sizes) + " |",
             "|" + " --- |" * (len(sizes) + 2)]
    for c, base in pairs:
        cells = []
        for s in sizes:
            ratios = [x[str(s)]["lat_us"] / y[str(s)]["lat_us"] for x, y in zip(runs[c], runs[base])]
            cells.append(f"x{statistics.median(ratios):.3f} [{min(ratios):.2f}-{max(ratios):.2f}], "
                         f"{sum(r > 1 for r in ratios)}/{len(ratios)} above 1")
        lines.append(f"| {c} | {base} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def recorder_cost(sizes: list[int], runs: dict[str, list[dict]], key: str) -> str:
    """Paired per-repeat differences (same round, adjacent jobs), then the median."""
    def diff(a: str, b: str, s: int) -> float:
        return statistics.median(x[str(s)][key] - y[str(s)][key] for x, y in zip(runs[a], runs[b]))
    lines = []
    for a, b, what in (("frnccl", "frnccl[buf=0]", "recorder (default vs FRNCCL_BUFFER_SIZE=0)"),
                       ("frnccl", "frnccl[stacks=none]", "python stack capture (python vs none)"),
                       ("frnccl[buf=0]", "gloo", "wrapper without recording (buf=0 vs gloo)"),
                       ("frnccl[slow=1]", "frnccl", "slow-rank detection (FRNCCL_SLOW_DETECT=1 vs off)")):
        if a in runs and b in runs:
            lines.append(f"- {what}: " + ", ".join(f"{human(s)} {diff(a, b, s):+.1f} us" for s in sizes))
    return "\n".join(lines)


def entry_size() -> str:
    """sizeof(frnccl::Entry), read from a compile error (no linking, only torch headers)."""
    from torch.utils.cpp_extension import include_paths

    probe = ('#include "Recorder.hpp"\n'
             "template <int N> struct EntrySizeIs;\n"
             "EntrySizeIs<sizeof(frnccl::Entry)> probe;\n")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text(probe)
        cmd = [os.environ.get("CXX", "c++"), "-std=c++17", "-fsyntax-only", f"-I{ROOT / 'backend'}"]
        cmd += [f"-I{p}" for p in include_paths()] + [str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    m = re.search(r"EntrySizeIs<(\d+)", proc.stderr)
    return f"sizeof(frnccl::Entry) = {m.group(1)} bytes" if m else "could not determine:\n" + proc.stderr[-2000:]


def run_turns(ap: argparse.ArgumentParser, args: argparse.Namespace, all_configs: dict, names: list[str]) -> None:
    """The --turns method: every configuration's job at once, taking turns (_turns.py)."""
    if args.rounds < 4:
        ap.error(f"--rounds must be at least 4; got {args.rounds}")
    if len(names) < 2 or len(set(names)) != len(names):
        ap.error(f"--turns needs at least two different configurations; got {','.join(names)}")
    import torch

    gpu = args.mode == "gpu"
    placements = rank_placements(2, gpu) if (gpu if args.pin is None else args.pin) else None
    if args.pin and placements is None:
        print("  warning: too few CPUs to keep the ranks apart; threads left to the scheduler", file=sys.stderr)
    results, seconds = _turns.coordinate(names, all_configs, args, placements, __file__, SCRUB)
    where = ("calling threads on " + " and ".join(p.describe() for p in placements)) if placements else "not pinned"
    print(f"mode {args.mode}, 2 ranks per job, {len(names)} jobs taking turns, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, {where}, {args.rounds} rounds, {seconds:.0f} s\n")
    print(_turns.report(results, names, args.sizes, TORCH_COUNTERPARTS))
    if args.json:
        Path(args.json).write_text(json.dumps({"mode": args.mode, "rounds": args.rounds, "results": results,
                                               "placements": [vars(p) for p in placements or []]}))


def write_json(args: argparse.Namespace, runs: dict[str, list[dict]], complete: bool) -> None:
    """Every raw figure so far; `complete` is false until every repeat has run."""
    Path(args.json).write_text(json.dumps({"mode": args.mode, "world": args.world, "complete": complete,
                                           "runs": runs}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=5, help="timed blocks per size inside a job (median taken)")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="2 repeats, fewer iterations")
    ap.add_argument("--sizes", type=str, default="", help="comma-separated byte counts, run in this order in each job")
    ap.add_argument("--configs", type=str, default="", help="comma-separated subset (baseline first)")
    ap.add_argument("--json", type=str, default="", help="write raw per-repeat figures here")
    ap.add_argument("--job-timeout", type=float, default=600)
    ap.add_argument("--entry-size", action="store_true", help="only print sizeof(frnccl::Entry)")
    ap.add_argument("--poll-status", action="store_true",
                    help="frnccl against frnccl asked `frnccl status` once a second (configurations frnccl, "
                         "frnccl[status 1/s], unless --configs)")
    turns = ap.add_argument_group("--turns: the configurations' jobs at once, taking turns (2 ranks each)")
    turns.add_argument("--turns", action="store_true", help="per-round ratios instead of separate jobs in sequence")
    turns.add_argument("--rounds", type=int, default=40, help="turns per configuration and size (>= 4)")
    turns.add_argument("--turn-timeout", type=float, default=180, help="seconds any one turn (or the start) may take")
    turns.add_argument("--exit-timeout", type=float, default=60,
                       help="seconds the ranks may take to exit after the last turn")
    turns.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None,
                       help="the same CPUs for every job's ranks (default: on in gpu mode)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", type=str, default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes = parse_sizes(ap, args.sizes, CPU_SIZES if args.mode == "cpu" else GPU_SIZES)
    if args.worker:
        if args.turns:
            _turns.worker(args, IDLE_FRNCCL_GROUP)
        else:
            worker(args)
        return
    if args.entry_size:
        print(entry_size())
        return
    if args.quick:
        args.repeats = min(args.repeats, 2)
        args.blocks = min(args.blocks, 3)
    all_configs = CPU_CONFIGS if args.mode == "cpu" else GPU_CONFIGS
    if args.mode == "gpu":
        import torch

        # --world 1 runs on one GPU: NCCL's own path on one rank, no network, so frnccl's share shows clearest.
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        need = min(args.world, 2)
        if gpus < need:
            raise SystemExit(f"--mode gpu --world {args.world} needs {need} GPU{'s' if need > 1 else ''}; "
                             f"this machine has {gpus}")
        args.world = min(args.world, gpus)
    defaults = GPU_DEFAULT_CONFIGS if args.mode == "gpu" else CPU_DEFAULT_CONFIGS
    if args.poll_status:
        defaults = ["frnccl", "frnccl[status 1/s]"]
    names = parse_names(ap, "--configs", args.configs or ",".join(defaults), all_configs)
    if args.turns:
        if any(all_configs[n][1].get(POLL_STATUS) for n in names):
            ap.error("--turns does not poll status; run frnccl[status 1/s] without --turns")
        run_turns(ap, args, all_configs, names)
        return
    runs: dict[str, list[dict]] = {c: [] for c in names}
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="frnccl-bench-") as dump_dir:
        for rep in range(args.repeats):
            order = names if rep % 2 == 0 else [names[0]] + names[:0:-1]  # A B C D / A D C B
            for name in order:
                backend, extra = all_configs[name]
                runs[name].append(run_job(name, backend, extra, args, dump_dir))
                if args.json:  # after every job, so a run cut short by a time limit keeps what it measured
                    write_json(args, runs, complete=False)
                print(f"  repeat {rep + 1}/{args.repeats} {name}: " + ", ".join(
                    f"{human(int(s))} {v['lat_us']:.1f}/{v['enqueue_us']:.1f}" for s, v in runs[name][-1].items()),
                    file=sys.stderr, flush=True)
    import torch

    print(f"mode {args.mode}, world size {args.world}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"{args.repeats} repeats x {len(names)} configurations interleaved, {time.time() - t_start:.0f} s\n")
    print(table(names, args.sizes, runs, "lat_us", "Latency per synchronous all_reduce"))
    print()
    print(table(names, args.sizes, runs, "enqueue_us", "CPU enqueue cost per async all_reduce"))
    print()
    pairs = [(c, names[0]) for c in names[1:]]
    pairs += [p for p in TORCH_COUNTERPARTS if p[0] in runs and p[1] in runs and p not in pairs]
    print(ratio_table(pairs, args.sizes, runs))
    if args.mode == "cpu" and recorder_cost(args.sizes, runs, "lat_us"):
        print("\nRecorder cost per op (median of paired per-repeat differences):")
        print("latency:\n" + recorder_cost(args.sizes, runs, "lat_us"))
        print("enqueue:\n" + recorder_cost(args.sizes, runs, "enqueue_us"))
    if args.json:
        write_json(args, runs, complete=True)


if __name__ == "__main__":
    main()
