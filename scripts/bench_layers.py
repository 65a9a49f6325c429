#!/usr/bin/env python3
"""Where frnccl's time per op goes: each layer between dist.all_reduce and NCCL, timed in one job.

    python scripts/bench_layers.py [--mode cpu|gpu] [--configs default,buf=0] [--rounds 40]
                                   [--sizes 8,1048576] [--arms a,b,...] [--block N] [--pin] [--json FILE]

bench_paired.py says how much slower an frnccl group is than a plain one; this says which layer the
difference lives in. Each 2-rank job holds, over the same ranks and devices (torch's recorder off in all):

  plain          dist.all_reduce on the default group (nccl on GPU, gloo on CPU)
  plain.group2   dist.all_reduce on a second plain group: what being another communicator costs
  frnccl         dist.all_reduce on an frnccl group
  plain.backend  the default group's backend object called directly: no c10d Python layer, no dispatcher
  inner.backend  a backend made the way frnccl makes its inner one (_make_nccl / _make_gloo), called directly
  fr.backend     an FrBackend around that same inner backend, called directly

Every round runs one block of synchronous all_reduces per arm, in an order that rotates each round, so
all arms see the same machine state. The report gives each arm's median time per op and, per round,
the paired differences that isolate one layer each (median [interquartile range], µs per op):

  FrBackend op path          fr.backend - inner.backend   (what frnccl adds around its exact inner backend)
  inner made like frnccl's   inner.backend - plain.backend
  c10d layer, plain group    plain - plain.backend
  c10d layer, frnccl group   frnccl - fr.backend
  another communicator       plain.group2 - plain

It does so three times: for wall time, and for CPU time while the block is being issued, split into the
calling thread's (what a CPU-bound training loop waits for) and every other thread's of the process. The
FrBackend op path in the calling thread's CPU is frnccl's own cost per op, without the host's scheduling
noise; in the other threads' CPU it is mostly frnccl's watchdog, the price of following ops in flight.

Each arm is its own Python function (arm_<name>), so a profile of a job running one arm
(`--arms fr.backend`, under `perf record`) shows that arm's path alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from _jobs import human, parse_names, parse_sizes, quartiles, rank_envs, run_paired_bench, run_ranks

RESULT = "LAYERS_RESULT "
ARMS = ("plain", "plain.group2", "frnccl", "plain.backend", "inner.backend", "fr.backend")
LAYERS = (
    ("FrBackend op path", "fr.backend", "inner.backend"),
    ("inner made like frnccl's", "inner.backend", "plain.backend"),
    ("c10d layer, plain group", "plain", "plain.backend"),
    ("c10d layer, frnccl group", "frnccl", "fr.backend"),
    ("another communicator", "plain.group2", "plain"),
)
CONFIGS: dict[str, dict[str, str]] = {
    "default": {},
    "stacks=none": {"FRNCCL_STACKS": "none"},
    "buf=0": {"FRNCCL_BUFFER_SIZE": "0"},
    "end_events=1ms": {"FRNCCL_END_EVENT_INTERVAL_US": "1000"},
}
SCRUB = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_ENABLE_TIMING")
# What each block is timed by: wall time, and the CPU time of the calling thread and of the rest of the process.
MEASURES = {
    "wall": "Median µs per synchronous all_reduce",
    "caller_cpu": "Median CPU µs per op, calling thread (the issuing loop; the final synchronize left out)",
    "other_cpu": "Median CPU µs per op, every other thread of the process during the issuing loop",
}


def iters_for(size: int, gpu: bool, block: int) -> int:
    if block > 0:
        return block
    if gpu:
        return 400 if size <= 64 * 1024 else 200 if size <= 1024 * 1024 else 20
    return 200 if size <= 64 * 1024 else 50


def pin_to_gpu_cpus(gpu: int) -> None:
    """Binds this process (before it starts any thread of its own) to the CPUs local to its GPU.

    On a host with several NUMA nodes, whether a rank's cores sit beside its GPU changes a small op's
    time from one job to the next; pinning keeps that out of comparisons across jobs. (On a one-node
    host it changes nothing: jobs there still differ by up to 1.7x; see docs/benchmarks.md.)
    """
    import torch

    props = torch.cuda.get_device_properties(gpu)
    try:
        bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        text = Path(f"/sys/bus/pci/devices/{bus}/local_cpulist").read_text().strip()
    except (AttributeError, OSError) as e:
        print(f"rank {gpu}: not pinned ({e})", file=sys.stderr, flush=True)
        return
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    os.sched_setaffinity(0, cpus & os.sched_getaffinity(0) or os.sched_getaffinity(0))
    print(f"rank {gpu}: GPU {bus} local CPUs {text}", file=sys.stderr, flush=True)


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import PrefixStore

    from fr_backend._native import native
    from fr_backend._registration import _make_gloo, _make_nccl
    from fr_backend.config import FrConfig

    gpu = args.mode == "gpu"
    rank = int(os.environ["RANK"])
    if gpu:
        torch.cuda.set_device(rank)
        if args.pin:
            pin_to_gpu_cpus(rank)
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    timeout = timedelta(seconds=120)
    dist.init_process_group("nccl" if gpu else "gloo", init_method="env://", timeout=timeout)
    plain = dist.group.WORLD
    plain2 = dist.new_group(backend="nccl" if gpu else "gloo")
    wrapped = dist.new_group(backend="frnccl")  # also starts frnccl's runtime (watchdog, monitor)
    store = PrefixStore("bench_layers/", dist.distributed_c10d._get_default_store())
    ranks = [0, 1]
    cpu_inner = _make_gloo(PrefixStore("cpu/", store), rank, 2, timeout, "layers", ranks)
    dump_timeout_ms = FrConfig.from_env().dump_timeout_ms
    cuda_inner = _make_nccl(PrefixStore("cuda/", store), rank, 2, timeout, "layers", ranks, dump_timeout_ms) if gpu else None
    inner = cuda_inner if gpu else cpu_inner
    fr = native().FrBackend(store, rank, 2, cpu_inner, cuda_inner, "layers", ranks, int(timeout.total_seconds() * 1000))
    plain_backend = plain._get_backend(device)
    opts = dist.AllreduceOptions()
    opts.asyncOp = False  # what dist.all_reduce(async_op=False) passes down

    def call_backend(backend, t) -> None:
        work = backend.allreduce([t], opts)
        if work is not None:  # as dist.all_reduce does: NCCL returns none for synchronous ops
            work.wait()

    def arm_plain(t, n):
        for _ in range(n):
            dist.all_reduce(t, group=plain)

    def arm_plain_group2(t, n):
        for _ in range(n):
            dist.all_reduce(t, group=plain2)

    def arm_frnccl(t, n):
        for _ in range(n):
            dist.all_reduce(t, group=wrapped)

    def arm_plain_backend(t, n):
        for _ in range(n):
            call_backend(plain_backend, t)

    def arm_inner_backend(t, n):
        for _ in range(n):
            call_backend(inner, t)

    def arm_fr_backend(t, n):
        for _ in range(n):
            call_backend(fr, t)

    arms: dict[str, Callable] = {
        "plain": arm_plain, "plain.group2": arm_plain_group2, "frnccl": arm_frnccl,
        "plain.backend": arm_plain_backend, "inner.backend": arm_inner_backend, "fr.backend": arm_fr_backend,
    }
    chosen = [a for a in ARMS if a in args.arms]

    def timed(arm: Callable, t, n: int) -> dict[str, float]:
        """µs per op: wall time to the GPU's end, and the CPU time the issuing loop took, split into the
        calling thread's and every other thread's of the process (frnccl's watchdog, torch's and NCCL's)."""
        dist.barrier(group=plain)
        if gpu:
            torch.cuda.synchronize()
        t0, caller0, process0 = time.perf_counter(), time.thread_time(), time.process_time()
        arm(t, n)
        # Before the final synchronize, which spins on the caller's thread.
        caller1, process1 = time.thread_time(), time.process_time()
        if gpu:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        caller = caller1 - caller0
        return {"wall": wall / n * 1e6, "caller_cpu": caller / n * 1e6,
                "other_cpu": ((process1 - process0) - caller) / n * 1e6}

    # {measure: {size: {arm: [µs per op, one per round]}}}
    out: dict[str, dict[str, dict[str, list[float]]]] = {m: {} for m in MEASURES}
    for size in args.sizes:
        t = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        n = iters_for(size, gpu, args.block)
        for name in chosen:  # warm-up: communicators, allocator, recorder slots
            timed(arms[name], t, n)
        for m in MEASURES:
            out[m][str(size)] = {name: [] for name in chosen}
        for r in range(args.rounds):
            k = r % len(chosen)
            for name in chosen[k:] + chosen[:k]:
                for m, v in timed(arms[name], t, n).items():
                    out[m][str(size)][name].append(v)
    dist.barrier(group=plain)
    if rank == 0:
        print(RESULT + json.dumps(out), flush=True)
    fr.shutdown()
    dist.destroy_process_group()


def run_job(config: str, args: argparse.Namespace, dump_dir: str) -> dict:
    envs = rank_envs(2, dump_dir, SCRUB, {"TORCH_FR_BUFFER_SIZE": "0", **CONFIGS[config]})
    cmd = [sys.executable, __file__, "--worker", "--mode", args.mode, "--rounds", str(args.rounds),
           "--sizes", ",".join(map(str, args.sizes)), "--arms", ",".join(args.arms), "--block", str(args.block)]
    cmd += ["--pin"] if args.pin else []
    return run_ranks(f"bench_layers: {config}", cmd, envs, args.job_timeout, RESULT)


def report(config: str, per_measure: dict[str, dict[str, dict[str, list[float]]]], sizes: list[int],
           arms: list[str]) -> str:
    head = "| | " + " | ".join(human(s) for s in sizes) + " |"
    rule = "|" + " --- |" * (len(sizes) + 1)
    lines = [f"frnccl configuration: {config}"]
    for measure, title in MEASURES.items():
        per_size = per_measure[measure]
        lines += ["", title, "", head, rule]
        for arm in arms:
            lines.append(f"| {arm} | " + " | ".join(f"{statistics.median(per_size[str(s)][arm]):.2f}" for s in sizes) + " |")
        lines += ["", "Per-round paired difference, µs per op: median [interquartile range]", "", head, rule]
        for label, a, b in LAYERS:
            if a not in arms or b not in arms:
                continue
            cells = []
            for s in sizes:
                f = per_size[str(s)]
                q1, q2, q3 = quartiles([x - y for x, y in zip(f[a], f[b])])
                cells.append(f"{q2:+.2f} [{q1:+.2f} to {q3:+.2f}]")
            lines.append(f"| {label} ({a} - {b}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--configs", default="default", help=f"comma-separated, from: {', '.join(CONFIGS)}")
    ap.add_argument("--rounds", type=int, default=40, help="rounds per size (>= 4)")
    ap.add_argument("--sizes", default="", help="comma-separated byte counts (default 8 B and 1 MB)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, from: {', '.join(ARMS)}")
    ap.add_argument("--block", type=int, default=0, help="all_reduces per block (default: by size, 20-400)")
    ap.add_argument("--pin", action="store_true", help="GPU mode: bind each rank to the CPUs local to its GPU")
    ap.add_argument("--json", default="", help="also write every raw figure here")
    ap.add_argument("--job-timeout", type=float, default=300)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes = parse_sizes(ap, args.sizes, [8, 1024 * 1024])
    args.arms = parse_names(ap, "--arms", args.arms, ARMS)
    if args.worker:
        worker(args)
        return
    configs, results = run_paired_bench(ap, args, "bench_layers", CONFIGS, run_job)
    arms = [a for a in ARMS if a in args.arms]
    print("\n\n".join(report(c, results[c], args.sizes, arms) for c in configs))
    if args.json:
        Path(args.json).write_text(json.dumps({"mode": args.mode, "rounds": args.rounds, "results": results}))


if __name__ == "__main__":
    main()
