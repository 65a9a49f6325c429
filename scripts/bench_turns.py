#!/usr/bin/env python3
"""Configurations that cannot share a process, compared in one run: their jobs run at once and take turns.

    python scripts/bench_turns.py [--mode cpu|gpu] [--configs "nccl[FR=0],nccl[FR default],frnccl"]
                                  [--rounds 40] [--sizes 8,65536,...] [--json FILE]

Why a third benchmark. torch reads TORCH_FR_BUFFER_SIZE once per process, so plain nccl with torch's
recorder at its default and frnccl (whose inner groups keep torch's recorder off) cannot be two groups of
one process, as bench_paired.py's arms are. bench_overhead.py runs each configuration as its own job,
one after the other, and two jobs of the same configuration differ by 20-60% at small sizes on the GPU
host, ten times the differences the goals ask about.

Here every configuration is a 2-rank job of its own (its own processes, store and communicator, the
configuration's environment), all started together on the same GPUs. A coordinator hands out turns
through a TCPStore of its own: in each round, for each size, each job in turn runs one block of
synchronous all_reduces while the others wait on the store, idle except for their background threads.
The order of the jobs rotates from round to round. Each round so gives every configuration a block
taken within a few milliseconds of the others', and the report is, per pair of configurations, the
median of the per-round ratios with their interquartile range, as bench_paired.py gives for groups of
one process.

Where its threads run is fixed per process for its life, and on the GPU host it outweighed the
configurations: a job whose ops did more work spent a fifth less CPU per op than another. So in GPU mode (`--pin`, the default there; `--no-pin`
leaves placement to the scheduler) every job's rank r runs its calling thread alone on the same CPU near
GPU r, from its warm-up on, and its other threads on the rest of that GPU's CPUs, away from both calling
threads' physical cores (scripts/_placement.py). What stays fixed per process (which pages it got, its
communicator's setup) shows in the rounds' spread and in a repeat of the run.

The configurations are bench_overhead.py's (--configs, baseline first). Each block starts after the
job's dist.barrier() and a synchronize; its latency is its wall time to the GPU's end (synchronize
again) per op; the calling thread's CPU per op is taken while the block is issued, before that
synchronize, which spins on the calling thread. The barrier decides how closely the two ranks start a
block: one on the GPU releases both as one all_reduce ends, one through the CPU does not, and the first
op then waits for the later rank (a 64 MB block of 20 ops took 4% longer; docs/benchmarks.md, eleventh
run). Every configuration here gets its backend's own barrier, on the GPU for nccl and frnccl alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from _jobs import free_port, parse_names, parse_sizes, quartiles, rank_envs, size_table
from _placement import Placement, pin_calling_thread, pin_other_threads, rank_placements
from bench_overhead import CPU_CONFIGS, GPU_CONFIGS, IDLE_FRNCCL_GROUP, SCRUB, TORCH_COUNTERPARTS

RESULT = "TURNS_RESULT "
JOB_ENV = "BENCH_TURNS_JOB"  # the configuration a rank process belongs to
PORT_ENV = "BENCH_TURNS_PORT"  # the coordinator's store
GPU_SIZES = [8, 64 * 1024, 1024 * 1024, 64 * 1024 * 1024]
CPU_SIZES = [8, 64 * 1024, 1024 * 1024]
GPU_DEFAULT_CONFIGS = ["nccl[FR=0]", "nccl[FR default]", "nccl[FR+timing]", "frnccl", "frnccl[gpu_timing=all]"]
CPU_DEFAULT_CONFIGS = ["gloo", "frnccl"]


def iters_for(size: int, gpu: bool) -> int:
    """Ops per block: blocks of 5-25 ms on the GPU host, so a turn's handover (~1 ms) is small beside them."""
    if gpu:
        return 500 if size <= 64 * 1024 else 200 if size <= 1024 * 1024 else 20
    return 200 if size <= 64 * 1024 else 50


def turn_key(round_: int, size: int, job: str) -> str:
    return f"go/{round_}/{size}/{job}"


def done_key(round_: int, size: int, job: str, rank: int) -> str:
    return f"done/{round_}/{size}/{job}/{rank}"


# ---------------------------------------------------------------------------------------------
# worker: one rank of one configuration's job
# ---------------------------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    pin_other_threads()  # before torch makes any thread
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    job = os.environ[JOB_ENV]
    gpu = args.mode == "gpu"
    timeout = timedelta(seconds=args.turn_timeout)
    if gpu:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group(args.backend, init_method="env://", timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group(args.backend, init_method="env://", timeout=timeout)
    if os.environ.get(IDLE_FRNCCL_GROUP) == "1":
        dist.new_group(backend="frnccl")  # kept, unused, until destroy_process_group
    turns = dist.TCPStore("127.0.0.1", int(os.environ[PORT_ENV]), is_master=False, timeout=timeout)

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize()

    def block(t, iters: int) -> tuple[float, float]:
        """µs per op: wall time to the GPU's end, and the calling thread's CPU while issuing."""
        dist.barrier()
        sync()
        cpu0, t0 = time.thread_time(), time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        cpu1 = time.thread_time()
        sync()
        return (time.perf_counter() - t0) / iters * 1e6, (cpu1 - cpu0) / iters * 1e6

    tensors = {size: torch.ones(max(1, size // 4), dtype=torch.float32, device=device) for size in args.sizes}
    # Warm-up before the first turn, all jobs at once: communicators, allocator, recorder slots.
    for size, t in tensors.items():
        block(t, iters_for(size, gpu))
    pin_calling_thread()
    turns.set(f"ready/{job}/{rank}", "1")
    out: dict[str, dict[str, list[float]]] = {str(s): {"lat": [], "cpu": []} for s in args.sizes}
    for r in range(args.rounds):
        for size, t in tensors.items():
            turns.wait([turn_key(r, size, job)])
            lat, cpu = block(t, iters_for(size, gpu))
            out[str(size)]["lat"].append(lat)
            out[str(size)]["cpu"].append(cpu)
            turns.set(done_key(r, size, job, rank), "1")
    dist.barrier()
    if rank == 0:
        print(RESULT + json.dumps(out), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# coordinator
# ---------------------------------------------------------------------------------------------


class Jobs:
    """Every configuration's rank processes, their output in files (a full pipe must never stall a rank)."""

    def __init__(self, configs: list[str], all_configs: dict, args: argparse.Namespace, tmp: str, port: int,
                 placements: list[Placement] | None):
        self.procs: list[tuple[str, int, subprocess.Popen, Path]] = []
        for job in configs:
            backend, extra = all_configs[job]
            envs = rank_envs(2, tmp, SCRUB, {**extra, JOB_ENV: job, PORT_ENV: str(port)})
            for env, placement in zip(envs, placements or []):
                env.update(placement.env())
            cmd = [sys.executable, __file__, "--worker", "--backend", backend, "--mode", args.mode,
                   "--rounds", str(args.rounds), "--sizes", ",".join(map(str, args.sizes)),
                   "--turn-timeout", str(args.turn_timeout)]
            for rank, env in enumerate(envs):
                log = Path(tmp, f"{len(self.procs)}.log")
                with log.open("w") as f:
                    proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, text=True)
                self.procs.append((job, rank, proc, log))

    def check(self) -> None:
        """Exits with a one-line reason (and the rank's output tail) if any rank has ended early."""
        for job, rank, proc, log in self.procs:
            if proc.poll() is not None:
                raise SystemExit(f"bench_turns: {job} rank {rank} exited early (code {proc.returncode}):\n"
                                 + log.read_text()[-3000:])

    def wait_for(self, store, keys: list[str], limit_s: float, what: str, poll_s: float) -> None:
        """Waits on the store in slices of poll_s, checking the ranks between them. A slice that ends
        without the keys also makes torch log a warning, so turns (milliseconds) use long slices, and
        the start (tens of seconds), where a warning per slice would flood the output, polls instead."""
        deadline = time.monotonic() + limit_s
        while True:
            try:
                if poll_s < 1:
                    if store.check(keys):
                        return
                    time.sleep(poll_s)
                else:
                    store.wait(keys, timedelta(seconds=poll_s))
                    return
            except Exception:  # the store's timeout; any other failure shows as a dead rank or the deadline
                pass
            self.check()
            if time.monotonic() > deadline:
                raise SystemExit(f"bench_turns: no rank reached {what} in {limit_s:.0f} s")

    def results(self, timeout: float) -> dict[str, dict]:
        """Rank 0's result of every job. A rank that measured everything but then hangs on its way out
        (in destroy_process_group, at exit) costs no figure: it is killed after `timeout`, with a warning."""
        out = {}
        deadline = time.monotonic() + timeout
        for job, rank, proc, log in self.procs:
            killed = False
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                killed = True
                print(f"  warning: {job} rank {rank} did not exit within {timeout:.0f} s of its last turn; killed",
                      file=sys.stderr, flush=True)
            text = log.read_text()
            if proc.returncode != 0 and not killed:
                raise SystemExit(f"bench_turns: {job} rank {rank} failed (code {proc.returncode}):\n{text[-3000:]}")
            if rank == 0:
                lines = [ln for ln in text.splitlines() if ln.startswith(RESULT)]
                if not lines:
                    raise SystemExit(f"bench_turns: {job} printed no result:\n{text[-3000:]}")
                out[job] = json.loads(lines[-1][len(RESULT):])
        return out

    def kill(self) -> None:
        for _, _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()


def coordinate(configs: list[str], all_configs: dict, args: argparse.Namespace,
               placements: list[Placement] | None) -> tuple[dict[str, dict], float]:
    import torch.distributed as dist

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=args.turn_timeout))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="frnccl-bench-turns-") as tmp:
        jobs = Jobs(configs, all_configs, args, tmp, port, placements)
        try:
            jobs.wait_for(store, [f"ready/{job}/{rank}" for job in configs for rank in (0, 1)],
                          args.turn_timeout, "its first turn", poll_s=0.2)
            print(f"  {len(configs)} jobs ready in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
            for r in range(args.rounds):
                order = configs[r % len(configs):] + configs[:r % len(configs)]
                for size in args.sizes:
                    for job in order:
                        store.set(turn_key(r, size, job), "1")
                        jobs.wait_for(store, [done_key(r, size, job, rank) for rank in (0, 1)],
                                      args.turn_timeout, f"the end of its turn ({job}, round {r})",
                                      poll_s=10)
                if (r + 1) % 10 == 0 or r + 1 == args.rounds:
                    print(f"  round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
            return jobs.results(args.exit_timeout), time.monotonic() - started
        finally:
            jobs.kill()


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------


def ratio_cell(a: list[float], b: list[float]) -> str:
    ratios = [y / x for x, y in zip(a, b)]
    q1, q2, q3 = quartiles(ratios)
    return f"x{q2:.3f} [{q1:.3f}-{q3:.3f}] {sum(r > 1 for r in ratios)}/{len(ratios)}"


def report(results: dict[str, dict], configs: list[str], sizes: list[int]) -> str:
    base = configs[0]

    def figures(config: str, size: int, kind: str) -> list[float]:
        return results[config][str(size)][kind]

    def cpu_cell(row: list[str], s: int) -> str:
        mine, theirs = figures(row[0], s, "cpu"), figures(base, s, "cpu")
        cell = f"{statistics.median(mine):.2f}"
        if row[0] != base:
            cell += f" ({statistics.median(x - y for x, y in zip(mine, theirs)):+.2f})"
        return cell

    pairs = [(c, base) for c in configs[1:]]
    pairs += [p for p in TORCH_COUNTERPARTS if p[0] in results and p[1] in results and p not in pairs]
    lines = size_table("Latency per synchronous all_reduce, median µs over rounds", ["configuration"],
                       [[c] for c in configs], sizes, lambda row, s: f"{statistics.median(figures(row[0], s, 'lat')):.2f}")
    lines += [""] + size_table("Latency against another configuration's block of the same round: median of per-round "
                               "ratios [interquartile range], rounds above 1", ["configuration", "against"],
                               [[c, against] for c, against in pairs], sizes,
                               lambda row, s: ratio_cell(figures(row[1], s, "lat"), figures(row[0], s, "lat")))
    lines += [""] + size_table(f"Calling thread's CPU per op while issuing, median µs over rounds (median per-round "
                               f"difference to {base})", ["configuration"], [[c] for c in configs], sizes, cpu_cell)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--configs", default="", help="comma-separated, baseline first (default: all of the mode's goals)")
    ap.add_argument("--rounds", type=int, default=40, help="turns per configuration and size (>= 4)")
    ap.add_argument("--sizes", default="", help="comma-separated byte counts")
    ap.add_argument("--json", default="", help="also write every raw figure here")
    ap.add_argument("--turn-timeout", type=float, default=180, help="seconds any one turn (or the start) may take")
    ap.add_argument("--exit-timeout", type=float, default=60, help="seconds the ranks may take to exit after the last turn")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None,
                    help="the same CPUs for every job's ranks (default: on in gpu mode)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    gpu = args.mode == "gpu"
    args.sizes = parse_sizes(ap, args.sizes, GPU_SIZES if gpu else CPU_SIZES)
    if args.worker:
        worker(args)
        return
    if args.rounds < 4:
        ap.error(f"--rounds must be at least 4; got {args.rounds}")
    all_configs = GPU_CONFIGS if gpu else CPU_CONFIGS
    default = GPU_DEFAULT_CONFIGS if gpu else CPU_DEFAULT_CONFIGS
    configs = parse_names(ap, "--configs", args.configs or ",".join(default), all_configs)
    if len(configs) < 2 or len(set(configs)) != len(configs):
        ap.error(f"--configs needs at least two different configurations; got {','.join(configs)}")
    import torch

    if gpu and torch.cuda.device_count() < 2:
        raise SystemExit("bench_turns: --mode gpu needs 2 GPUs")
    placements = rank_placements(2, gpu) if (gpu if args.pin is None else args.pin) else None
    if args.pin and placements is None:
        print("  warning: too few CPUs to keep the ranks apart; threads left to the scheduler", file=sys.stderr)
    results, seconds = coordinate(configs, all_configs, args, placements)
    where = ("calling threads on " + " and ".join(p.describe() for p in placements)) if placements else "not pinned"
    print(f"mode {args.mode}, 2 ranks per job, {len(configs)} jobs taking turns, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs, {where}, {args.rounds} rounds, {seconds:.0f} s\n")
    print(report(results, configs, args.sizes))
    if args.json:
        Path(args.json).write_text(json.dumps({"mode": args.mode, "rounds": args.rounds, "results": results,
                                               "placements": [vars(p) for p in placements or []]}))


if __name__ == "__main__":
    main()
