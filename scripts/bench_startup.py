#!/usr/bin/env python3
"""What frnccl adds to a job's startup: a torchrun job plain against the same job under FRNCCL_ENABLE=1.

Each job is `torchrun --standalone --nproc-per-node N` of a script that imports torch, makes a CPU DeviceMesh
as square as N divides (1x2, 2x2, 4x4 at 2, 4, 16 ranks: its default group, and the dp and tp groups), runs one
all_reduce on each and tears down: what a training job does before its first step. Plain and enabled jobs
alternate (the first of each pair alternates too), so a machine's load falls on both alike. Reported per size:
the median wall time of each, the median of the per-pair ratios, and the largest peak RSS of any one rank
(VmHWM, printed by each rank as it ends).

    python3 scripts/bench_startup.py [--sizes 2,4,16] [--pairs 6] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = """
import math, os, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
world = int(os.environ["WORLD_SIZE"])
rows = max(r for r in range(1, math.isqrt(world) + 1) if world % r == 0)  # 1x2, 2x2, 4x4: as square as it divides
mesh = init_device_mesh("cpu", (rows, world // rows), mesh_dim_names=("dp", "tp"))
for dim in ("dp", "tp"):
    dist.all_reduce(torch.ones(4), group=mesh[dim].get_group())
dist.destroy_process_group()
with open("/proc/self/status") as status:
    peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
os.write(1, f"VmHWM {peak}\\n".encode())  # one write: the ranks share the pipe
"""


# torch's own Gloo workers can abort a process as the interpreter finalizes, after the script's last line (plain
# torch or not): such a job is run again, and counted.
GLOO_EXIT_ABORT = b"terminate called without an active exception"
exit_aborts = 0


def run_job(script: Path, size: int, enabled: bool, dump_dir: Path) -> tuple[float, int]:
    """Wall seconds and the largest peak RSS (KiB) of any rank of one job; exits if it fails."""
    global exit_aborts
    for _ in range(3):
        wall, rss, code, err = run_once(script, size, enabled, dump_dir)
        if code == 0:
            return wall, rss
        if GLOO_EXIT_ABORT not in err:
            break
        exit_aborts += 1
    raise SystemExit(f"bench_startup: the {size}-rank job ({'enabled' if enabled else 'plain'}) failed "
                     f"(exit {code}):\n{err.decode(errors='replace')[-2000:]}")


def run_once(script: Path, size: int, enabled: bool, dump_dir: Path) -> tuple[float, int, int, bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRNCCL_")}
    env.update(OMP_NUM_THREADS="1", TORCH_DEVICE_BACKEND_AUTOLOAD="1", FRNCCL_DUMP_DIR=str(dump_dir))
    if enabled:
        env["FRNCCL_ENABLE"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={size}", str(script)]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate()
    wall = time.monotonic() - start
    # Each rank's peak RSS in KiB; a job whose ranks did not all print it counts as failed below.
    peaks = [int(line.split()[1]) for line in out.decode(errors="replace").splitlines() if line.startswith("VmHWM ")]
    code = proc.returncode if proc.returncode != 0 or len(peaks) == size else 1
    if code != proc.returncode:
        err += f"\n{len(peaks)} of {size} ranks reported their peak RSS".encode()
    return wall, max(peaks, default=0), code, err


def mesh_shape(size: int) -> str:
    """The job's mesh at `size` ranks, as JOB makes it."""
    rows = max(r for r in range(1, math.isqrt(size) + 1) if size % r == 0)
    return f"{rows}x{size // rows}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4,16", help="ranks per job, comma-separated, each at least 2")
    parser.add_argument("--pairs", type=int, default=6, help="plain/enabled pairs per size")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes must be numbers separated by commas, got {args.sizes!r}")
    if any(s < 2 for s in sizes) or args.pairs < 1:
        parser.error("--sizes must be numbers of at least 2, and --pairs at least 1")
    results = []
    with tempfile.TemporaryDirectory(prefix="frnccl-bench-startup-") as tmp:
        script = Path(tmp) / "job.py"
        script.write_text(JOB)
        for size in sizes:
            walls: dict[bool, list[float]] = {False: [], True: []}
            rss: dict[bool, list[int]] = {False: [], True: []}
            ratios = []
            for pair in range(args.pairs):
                order = (False, True) if pair % 2 == 0 else (True, False)
                got = {}
                for enabled in order:
                    got[enabled] = run_job(script, size, enabled, Path(tmp) / "dumps")
                    walls[enabled].append(got[enabled][0])
                    rss[enabled].append(got[enabled][1])
                ratios.append(got[True][0] / got[False][0])
                print(f"  {size} ranks, pair {pair + 1}/{args.pairs}: plain {got[False][0]:.2f} s, "
                      f"FRNCCL_ENABLE=1 {got[True][0]:.2f} s", flush=True)
            row = {
                "ranks": size, "mesh": mesh_shape(size), "pairs": args.pairs,
                "plain_s": statistics.median(walls[False]), "enabled_s": statistics.median(walls[True]),
                "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                "plain_peak_rss_mib": max(rss[False]) / 1024, "enabled_peak_rss_mib": max(rss[True]) / 1024,
            }
            results.append(row)
    print("\n| ranks | mesh | pairs | plain (median) | FRNCCL_ENABLE=1 (median) | ratio (median, range) | peak RSS a rank |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['ranks']} | {r['mesh']} | {r['pairs']} | {r['plain_s']:.2f} s | {r['enabled_s']:.2f} s | "
              f"{r['ratio']:.3f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) | "
              f"{r['plain_peak_rss_mib']:.0f} / {r['enabled_peak_rss_mib']:.0f} MiB |")
    print(f"jobs run again after torch's Gloo exit abort: {exit_aborts}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
