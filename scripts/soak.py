#!/usr/bin/env python3
"""Soak: many small collectives through frnccl on CPU; memory, threads and open files must stay flat.

Starts --world ranks (default 2) of this script over env:// on 127.0.0.1 (rank 0 hosts the TCPStore),
each on an frnccl default group (Gloo inside). Every rank issues --ops collectives, cycling through
all_reduce, broadcast, all_gather_into_tensor and barrier on small tensors, and every --sample-every ops
samples its own RSS (/proc/self/status VmRSS), thread count (/proc/self/task) and open fds
(/proc/self/fd), and checks the last results. The ring buffer (FRNCCL_BUFFER_SIZE, default 20000 here
too) wraps many times over a long run, so what is measured is the steady state.

Verdict, per rank, over the samples taken at or after --warmup ops (the first of them is the baseline):
  memory   flat: RSS never exceeds the baseline by more than --rss-tolerance-mb (default 16 MB)
  threads  no growth: the same count in every sample after warm-up
  fds      no growth: the same count in every sample after warm-up
plus: every sampled result right, no dump written (a healthy job never dumps), every rank exits 0.
Exit status: 0 when every rank passes, 1 otherwise, 2 when the job did not finish (--timeout).

--backend gloo runs the same job on plain gloo: a baseline that tells frnccl's share of any drift.

usage: python scripts/soak.py [--ops 1000000] [--sample-every 20000] [--warmup 100000] [--world 2]
                              [--buffer-size N] [--rss-tolerance-mb 16] [--backend frnccl|gloo] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SAMPLE = "SOAK_SAMPLE "
DONE = "SOAK_DONE "
OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "barrier")


# ----------------------------------------------------------------------------- one rank


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def _sample(ops: int, t0: float, ok: bool) -> dict[str, Any]:
    return {
        "ops": ops,
        "t": round(time.monotonic() - t0, 3),
        "rss_kb": _rss_kb(),
        "threads": len(os.listdir("/proc/self/task")),
        "fds": len(os.listdir("/proc/self/fd")),
        "ok": ok,
    }


def worker(args: argparse.Namespace) -> int:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group(args.backend, init_method="env://", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    red = torch.zeros(16)
    bc = torch.zeros(8)
    gathered = torch.zeros(world * 4)
    mine = torch.full((4,), float(rank))
    want_gather = torch.arange(world, dtype=torch.float32).repeat_interleave(4)
    t0 = time.monotonic()

    def emit(sample: dict[str, Any]) -> None:
        sys.stdout.write(SAMPLE + json.dumps(sample) + "\n")
        sys.stdout.flush()

    emit(_sample(0, t0, True))
    ok = True
    bc_src = -1
    for i in range(1, args.ops + 1):
        kind = i % 4
        if kind == 0:
            red.fill_(rank + 1.0)
            dist.all_reduce(red)
        elif kind == 1:
            bc.fill_(float(rank))
            bc_src = (i // 4) % world
            dist.broadcast(bc, src=bc_src)
        elif kind == 2:
            dist.all_gather_into_tensor(gathered, mine)
        else:
            dist.barrier()
        if i % args.sample_every == 0:
            # The newest result of each kind must be right.
            ok = ok and bool(torch.all(red == world * (world + 1) / 2)) and bool(torch.equal(gathered, want_gather))
            ok = ok and (bc_src < 0 or bool(torch.all(bc == float(bc_src))))
            emit(_sample(i, t0, ok))
    # Every rank has taken its last sample before any tears down: a rank that leaves tells the store (a
    # connection of its own), which the store's host, rank 0, would count among its open fds.
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.write(DONE + json.dumps({"rank": rank, "seconds": round(time.monotonic() - t0, 3)}) + "\n")
    sys.stdout.flush()
    return 0


# ----------------------------------------------------------------------------- the launcher


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _judge(samples: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    after = [s for s in samples if s["ops"] >= args.warmup]
    if not after:
        return {"pass": False, "why": "no sample after warm-up"}
    base = after[0]
    rss_growth_mb = (max(s["rss_kb"] for s in after) - base["rss_kb"]) / 1024
    end_growth_mb = (after[-1]["rss_kb"] - base["rss_kb"]) / 1024
    slope = 0.0  # least-squares RSS growth, MB per 100k ops, after warm-up
    if len(after) >= 2:
        xs = [s["ops"] for s in after]
        ys = [s["rss_kb"] / 1024 for s in after]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        den = sum((x - mx) ** 2 for x in xs)
        slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den) * 100_000 if den else 0.0
    threads = sorted({s["threads"] for s in after})
    fds = sorted({s["fds"] for s in after})
    verdict = {
        "baseline_ops": base["ops"],
        "baseline_rss_mb": round(base["rss_kb"] / 1024, 1),
        "start_rss_mb": round(samples[0]["rss_kb"] / 1024, 1),
        "max_rss_growth_mb": round(rss_growth_mb, 2),
        "end_rss_growth_mb": round(end_growth_mb, 2),
        "rss_slope_mb_per_100k_ops": round(slope, 3),
        "rss_tolerance_mb": args.rss_tolerance_mb,
        "threads_after_warmup": threads,
        "fds_after_warmup": fds,
        "threads_start": samples[0]["threads"],
        "fds_start": samples[0]["fds"],
        "results_ok": all(s["ok"] for s in samples),
        "memory_flat": rss_growth_mb <= args.rss_tolerance_mb,
        "threads_flat": len(threads) == 1,
        "fds_flat": len(fds) == 1,
    }
    verdict["pass"] = all(verdict[k] for k in ("memory_flat", "threads_flat", "fds_flat", "results_ok"))
    return verdict


def _table(rank: int, samples: list[dict[str, Any]]) -> str:
    rows = [f"rank {rank}", "| ops | seconds | ops/s (interval) | RSS MB | threads | fds |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    prev = None
    for s in samples:
        rate = ""
        if prev is not None and s["t"] > prev["t"]:
            rate = f"{(s['ops'] - prev['ops']) / (s['t'] - prev['t']):.0f}"
        rows.append(f"| {s['ops']} | {s['t']:.1f} | {rate} | {s['rss_kb'] / 1024:.1f} | {s['threads']} | {s['fds']} |")
        prev = s
    return "\n".join(rows)


def launch(args: argparse.Namespace) -> int:
    port = _free_port()
    dump_dir = Path(tempfile.mkdtemp(prefix="frnccl-soak-dumps-"))
    procs, logs = [], []
    start = time.monotonic()
    for rank in range(args.world):
        env = dict(os.environ)
        env.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(args.world),
            LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(args.world), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
            FRNCCL_DUMP_DIR=str(dump_dir),
        )
        if args.buffer_size is not None:
            env["FRNCCL_BUFFER_SIZE"] = str(args.buffer_size)
        log = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--ops", str(args.ops),
               "--sample-every", str(args.sample_every), "--backend", args.backend]
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True))
        logs.append(log)
    timed_out = False
    try:
        deadline = start + args.timeout
        while any([p.poll() is None for p in procs]):  # a list: every rank is polled, each round
            if time.monotonic() > deadline:
                timed_out = True
                break
            if any(p.returncode not in (None, 0) for p in procs):
                deadline = min(deadline, time.monotonic() + 15)  # one rank failed: the others follow soon
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
    elapsed = time.monotonic() - start
    dumps = sorted(str(p.relative_to(dump_dir)) for p in dump_dir.rglob("*") if p.is_file())
    report: dict[str, Any] = {
        "command": " ".join([os.path.basename(sys.executable), "scripts/soak.py", *sys.argv[1:]]),
        "backend": args.backend, "ops": args.ops, "world": args.world, "sample_every": args.sample_every, "warmup": args.warmup,
        "buffer_size": args.buffer_size, "elapsed_s": round(elapsed, 1), "timed_out": timed_out,
        "dumps_written": dumps, "ranks": [],
    }
    all_pass = not timed_out and not dumps
    for rank, (p, log) in enumerate(zip(procs, logs)):
        log.seek(0)
        out = log.read()
        samples = [json.loads(ln[len(SAMPLE):]) for ln in out.splitlines() if ln.startswith(SAMPLE)]
        done = [json.loads(ln[len(DONE):]) for ln in out.splitlines() if ln.startswith(DONE)]
        verdict = _judge(samples, args) if samples else {"pass": False, "why": "no samples"}
        verdict["exit_code"] = p.returncode
        verdict["pass"] = verdict["pass"] and p.returncode == 0 and bool(done)
        all_pass = all_pass and verdict["pass"]
        report["ranks"].append({"rank": rank, "samples": samples, "verdict": verdict,
                                "seconds": done[0]["seconds"] if done else None})
        print(_table(rank, samples))
        print(f"rank {rank} verdict: " + json.dumps(verdict))
        if not verdict["pass"]:
            other = [ln for ln in out.splitlines() if not ln.startswith(SAMPLE)]
            print("\n".join(other[-40:]))
        print()
    report["pass"] = all_pass
    ops_s = args.ops / elapsed if elapsed else 0.0
    print(f"{args.backend}: {args.ops} collectives per rank, {args.world} ranks, {elapsed:.0f} s ({ops_s:.0f} ops/s per rank incl. start-up); "
          f"dumps written: {len(dumps)}")
    print(f"VERDICT: {'PASS' if all_pass else 'FAIL'} (after {args.warmup} warm-up ops: RSS within "
          f"+{args.rss_tolerance_mb} MB of the baseline, thread and fd counts constant, results right, no dumps)")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    for log in logs:
        log.close()
    for p in sorted(dump_dir.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    dump_dir.rmdir()
    if timed_out:
        return 2
    return 0 if all_pass else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=1_000_000, help="collectives per rank")
    parser.add_argument("--sample-every", type=int, default=20_000)
    parser.add_argument("--warmup", type=int, default=100_000, help="ops before the baseline sample")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--buffer-size", type=int, default=None, help="FRNCCL_BUFFER_SIZE (default: frnccl's, 20000)")
    parser.add_argument("--rss-tolerance-mb", type=float, default=16.0)
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds before the job is stopped")
    parser.add_argument("--json", help="write samples and verdicts here")
    parser.add_argument("--backend", default="frnccl", choices=("frnccl", "gloo"),
                        help="gloo: the same job on plain gloo, as a baseline for the figures")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    if args.warmup >= args.ops:
        parser.error("--warmup must be below --ops")
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
