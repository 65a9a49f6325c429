"""The turns method of bench_overhead.py (--turns): configurations that cannot share a process, compared in one run.

torch reads TORCH_FR_BUFFER_SIZE once per process, so plain nccl with torch's recorder at its default and
frnccl (whose inner groups keep torch's recorder off) cannot be two groups of one process. Run as separate
jobs, one after the other, two jobs of the same configuration differ by 20-60% at small sizes on the GPU
host, ten times the differences the goals ask about.

Here every configuration is a 2-rank job of its own (its own processes, store and communicator, the
configuration's environment), all started together on the same GPUs. A coordinator hands out turns
through a TCPStore of its own: in each round, for each size, each job in turn runs one block of
synchronous all_reduces while the others wait on the store, idle except for their background threads.
The order of the jobs rotates from round to round. Each round so gives every configuration a block
taken within a few milliseconds of the others', and the report is, per pair of configurations, the
median of the per-round ratios with their interquartile range.

Where its threads run is fixed per process for its life, and on the GPU host it outweighed the
configurations: a job whose ops did more work spent a fifth less CPU per op than another. So in GPU mode
(`--pin`, the default there; `--no-pin` leaves placement to the scheduler) every job's rank r runs its
calling thread alone on the same CPU near GPU r, from its warm-up on, and its other threads on the rest of
that GPU's CPUs, away from both calling threads' physical cores (_placement.py). What stays fixed per
process (which pages it got, its communicator's setup) shows in the rounds' spread and in a repeat of the run.

Each block starts after the job's dist.barrier() and a synchronize; its latency is its wall time to the
GPU's end (synchronize again) per op; the calling thread's CPU per op is taken while the block is issued,
before that synchronize, which spins on the calling thread. The barrier decides how closely the two ranks
start a block: one on the GPU releases both as one all_reduce ends, one through the CPU does not, and the
first op then waits for the later rank (a 64 MB block of 20 ops took 4% longer; docs/benchmarks.md, eleventh
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

from _jobs import free_port, quartiles, rank_envs, size_table
from _placement import Placement, pin_calling_thread, pin_other_threads

Configs = dict[str, tuple[str, dict[str, str]]]  # name -> (backend, extra env)

RESULT = "TURNS_RESULT "
JOB_ENV = "BENCH_TURNS_JOB"  # the configuration a rank process belongs to
PORT_ENV = "BENCH_TURNS_PORT"  # the coordinator's store


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


def worker(args: argparse.Namespace, idle_env: str) -> None:
    """One rank of one configuration's job; ``idle_env`` set to 1 also makes an frnccl group it never uses."""
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
    if os.environ.get(idle_env) == "1":
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

    def __init__(self, configs: list[str], all_configs: Configs, args: argparse.Namespace, tmp: str, port: int,
                 placements: list[Placement] | None, script: str, scrub: tuple[str, ...]):
        self.procs: list[tuple[str, int, subprocess.Popen, Path]] = []
        for job in configs:
            backend, extra = all_configs[job]
            envs = rank_envs(2, tmp, scrub, {**extra, JOB_ENV: job, PORT_ENV: str(port)})
            for env, placement in zip(envs, placements or []):
                env.update(placement.env())
            cmd = [sys.executable, script, "--worker", "--turns", "--backend", backend, "--mode", args.mode,
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
                raise SystemExit(f"bench_overhead --turns: {job} rank {rank} exited early (code {proc.returncode}):\n"
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
                raise SystemExit(f"bench_overhead --turns: no rank reached {what} in {limit_s:.0f} s")

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
                raise SystemExit(f"bench_overhead --turns: {job} rank {rank} failed (code {proc.returncode}):\n"
                                 + text[-3000:])
            if rank == 0:
                lines = [ln for ln in text.splitlines() if ln.startswith(RESULT)]
                if not lines:
                    raise SystemExit(f"bench_overhead --turns: {job} printed no result:\n{text[-3000:]}")
                out[job] = json.loads(lines[-1][len(RESULT):])
        return out

    def kill(self) -> None:
        for _, _, proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()


def coordinate(configs: list[str], all_configs: Configs, args: argparse.Namespace, placements: list[Placement] | None,
               script: str, scrub: tuple[str, ...]) -> tuple[dict[str, dict], float]:
    """Starts every configuration's job (``script --worker --turns``), hands out the turns; rank 0's results
    of every job, and the seconds it all took."""
    import torch.distributed as dist

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=args.turn_timeout))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="frnccl-bench-turns-") as tmp:
        jobs = Jobs(configs, all_configs, args, tmp, port, placements, script, scrub)
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


def report(results: dict[str, dict], configs: list[str], sizes: list[int],
           counterparts: list[tuple[str, str]]) -> str:
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
    pairs += [p for p in counterparts if p[0] in results and p[1] in results and p not in pairs]
    lines = size_table("Latency per synchronous all_reduce, median µs over rounds", ["configuration"],
                       [[c] for c in configs], sizes, lambda row, s: f"{statistics.median(figures(row[0], s, 'lat')):.2f}")
    lines += [""] + size_table("Latency against another configuration's block of the same round: median of per-round "
                               "ratios [interquartile range], rounds above 1", ["configuration", "against"],
                               [[c, against] for c, against in pairs], sizes,
                               lambda row, s: ratio_cell(figures(row[1], s, "lat"), figures(row[0], s, "lat")))
    lines += [""] + size_table(f"Calling thread's CPU per op while issuing, median µs over rounds (median per-round "
                               f"difference to {base})", ["configuration"], [[c] for c in configs], sizes, cpu_cell)
    return "\n".join(lines)
