#!/usr/bin/env python3
"""How well the live slow-rank detector (fr_backend.slow) names the rank that slows a job, and how often it
names anyone where no rank is at fault: real gloo jobs on this machine (test/workers/slow_job.py).

Each case runs --runs times. A run is a job of W ranks whose step is a sleep of --step-ms ("compute"; many
ranks share few cores) followed by the step's all_reduces (flat: two of the world; mesh: one in the rank's tp
row, one in its dp column). In the `slow` cases one rank (a different one each run) computes FACTOR times as
long from a step well past the detector's baseline until some steps before the end. Reported per case: the
runs in which the slow rank was named, and only it; the runs in which any other rank was named; the seconds
from the slowdown to the line (rank 0's one-second ticks); whether the recovery line came. The `quiet` cases
(one rank pausing 5 s once, every rank slowed alike, no slowdown) count the runs with any slow line at all.

The detector's window is --window-s (2 s here, 10 s by default in a job): what is measured is the rules, and
naming takes 2 windows after 3 of baseline whatever the window, so the 60 s bound of a job with 10 s windows
reads as 12 s here.

usage: python scripts/bench_slow_rank.py [--runs 20] [--cases flat4,mesh4,flat16,mesh16,factor1.1,factor2,quiet4]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _jobs import parse_names, rank_envs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "test" / "workers" / "slow_job.py"
LINE = re.compile(r"^frnccl: slow: rank (\d+) \(host .+, pid \d+\) (enters|is no longer late)")
CASES = {
    # name: (world, shape, tp, factor, kind)
    "flat4": (4, "flat", 2, 1.3, "slow"),
    "mesh4": (4, "mesh", 2, 1.3, "slow"),
    "flat16": (16, "flat", 4, 1.3, "slow"),
    "mesh16": (16, "mesh", 4, 1.3, "slow"),
    "factor1.1": (4, "flat", 2, 1.1, "slow"),
    "factor2": (4, "flat", 2, 2.0, "slow"),
    "quiet4": (4, "flat", 2, 1.5, "quiet"),
}


def one_run(world: int, shape: str, tp: int, factor: float, kind: str, slow_rank: int, window_s: float,
            step_ms: int) -> dict:
    import subprocess

    steps_per_window = window_s / (step_ms / 1e3 + 0.005)  # a step: its compute, and a few ms of all_reduces
    slow_from = int(steps_per_window * 5)  # past the baseline's 3 windows and the first partial one
    slow_until = slow_from + int(steps_per_window * 6)
    steps = slow_until + int(steps_per_window * 5)
    extra = {"FRNCCL_SLOW_DETECT": "1", "FRNCCL_SLOW_WINDOW_SEC": str(window_s), "STEP_MS": str(step_ms), "SHAPE": shape, "MESH_TP": str(tp),
             "SLOW_FACTOR": str(factor), "SLOW_FROM": str(slow_from), "SLOW_UNTIL": str(slow_until), "STEPS": str(steps)}
    if kind == "slow":
        extra["SLOW_RANK"] = str(slow_rank)
    else:  # one pause, then every rank slowed alike
        extra.update(PAUSE_RANK=str(slow_rank), PAUSE_AT=str(slow_from // 2), PAUSE_S="5", ALL_SLOW="1")
    with tempfile.TemporaryDirectory() as dumps:
        envs = rank_envs(world, dumps, (), extra)
        procs = [subprocess.Popen([sys.executable, str(WORKER)], env=e, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for e in envs]
        outs = [p.communicate(timeout=600)[0] for p in procs]
    lines = outs[0].splitlines()
    ticks = 0
    slow_at = well_at = None
    named: list[tuple[str, int, int]] = []  # (kind, rank, ticks since the slowdown)
    for line in lines:
        if line.startswith("T "):
            ticks += 1
        elif line == "PHASE slow":
            slow_at = ticks
        elif line == "PHASE well":
            well_at = ticks
        m = LINE.match(line)
        if m:
            named.append(("slow" if m.group(2) == "enters" else "well", int(m.group(1)),
                          ticks - (slow_at if slow_at is not None else 0)))
    return {"ok": all(p.returncode == 0 for p in procs), "named": named, "slow_at": slow_at, "well_at": well_at}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--cases", default="flat4,mesh4,flat16,mesh16,factor1.1,factor2,quiet4")
    ap.add_argument("--window-s", type=float, default=2.0)
    ap.add_argument("--step-ms", type=int, default=40)
    ap.add_argument("--json", help="write the per-case results here")
    args = ap.parse_args()
    cases = parse_names(ap, "--cases", args.cases, CASES)
    results = {}
    print("| case | ranks | runs | slow rank named alone | another rank named | s to the line (median, max) | recovery line |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in cases:
        world, shape, tp, factor, kind = CASES[name]
        runs = []
        started = time.monotonic()
        for i in range(args.runs):
            slow_rank = (1 + 2 * i) % world  # a different rank each run, rank 0 among them
            r = one_run(world, shape, tp, factor, kind, slow_rank, args.window_s, args.step_ms)
            r["slow_rank"] = slow_rank
            runs.append(r)
            print(f"  {name} run {i + 1}/{args.runs}: {r['named']} ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
        right = [r for r in runs if r["ok"] and {k for k, x, _ in r["named"] if x == r["slow_rank"]} >= {"slow"}
                 and all(x == r["slow_rank"] for _, x, _ in r["named"])]
        wrong = [r for r in runs if any(x != r["slow_rank"] or kind == "quiet" for _, x, _ in r["named"])]
        delays = [t for r in right for k, _, t in r["named"] if k == "slow"]
        recovered = sum(1 for r in right if any(k == "well" for k, _, _ in r["named"]))
        delay = f"{statistics.median(delays):.0f}, {max(delays):.0f}" if delays else "-"
        named_alone = f"{len(right)}/{args.runs}" if kind == "slow" else "-"
        print(f"| {name} (x{factor:g}{', pause + all slow' if kind == 'quiet' else ''}) | {world} | {args.runs} | "
              f"{named_alone} | {len(wrong)}/{args.runs} | {delay} | "
              f"{f'{recovered}/{len(right)}' if kind == 'slow' else '-'} |", flush=True)
        results[name] = runs
    if args.json:
        Path(args.json).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
