#!/usr/bin/env python3
"""Time one rank's dump of a full ring buffer (default 20,000 entries), and its bytes on disk.

A 1-rank frnccl job (in-memory store, CPU) issues --ops small all_reduces (more than the
buffer holds, so the buffer is full), then calls fr_backend.dump() --dumps times. Each dump
is timed three ways: the monitor thread's own figure (its log line '... in X ms': snapshot, build,
encode, write, fsync), the wall time of the fr_backend.dump() call from Python (it returns once the
files are written; the monitor frees the dump's tree after that), and the CPU time the process spent
from the call until 0.3 s after it returned (all its threads, the freeing included: what the dump costs,
whatever else the machine runs); the bytes are every file the dump wrote (all formats), per rank.

Configurations, each in its own process (frnccl's configuration is fixed per process):
  default       what a new user gets: python stacks symbolized at dump time, FRNCCL_DUMP_FORMATS
                unset (compact)
  default/pickle, default/json, default/chrome, default/pickle+json
                the same dump in one other format (pickle+json: the default before compact)
  unsymbolized  FRNCCL_SYMBOLIZE_TIMEOUT_MS=0: stacks captured per op, never symbolized at dump
  stacks=none   FRNCCL_STACKS=none: no stacks at all
  unsymbolized/pickle, unsymbolized/json   one format only, unsymbolized
The goals: the default dump of 20,000 entries <= 1 MB on disk and <= 100 ms.

--worlds 2,16384,100000: the default configuration once per world size W, for the last rank of a
DeviceMesh TP x DP job (TP = --tp, or W if smaller): besides the 1-rank group the ops run on, the process
holds that rank's three mesh groups (the W ranks, its TP block, its DP stride), registered with the
recorder as torch's DeviceMesh makes them, so each dump carries their pg_config as a real rank's would
(no ops on them: only what membership adds to a dump shows).

usage: python scripts/bench_dump.py [--entries 20000] [--dumps 7] [--configs default,default/pickle]
                                    [--worlds 2,16384,100000 [--tp 8]]
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

RESULT = "BENCH_RESULT "
CONFIGS = {
    "default": {},
    "default/pickle": {"FRNCCL_DUMP_FORMATS": "pickle"},
    "default/json": {"FRNCCL_DUMP_FORMATS": "json"},
    "default/chrome": {"FRNCCL_DUMP_FORMATS": "chrome"},
    "default/pickle+json": {"FRNCCL_DUMP_FORMATS": "pickle,json"},
    "unsymbolized": {"FRNCCL_SYMBOLIZE_TIMEOUT_MS": "0"},
    "stacks=none": {"FRNCCL_STACKS": "none"},
    "symbolized": {},  # the same as default (kept for the commands of earlier runs)
    # breakdown of the unsymbolized dump by format
    "unsymbolized/pickle": {"FRNCCL_SYMBOLIZE_TIMEOUT_MS": "0", "FRNCCL_DUMP_FORMATS": "pickle"},
    "unsymbolized/json": {"FRNCCL_SYMBOLIZE_TIMEOUT_MS": "0", "FRNCCL_DUMP_FORMATS": "json"},
}
LOG = re.compile(r"wrote dump \S+ \((\d+) entries, reason manual\) to (\S+) in (\d+) ms")


def worker(args: argparse.Namespace) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import fr_backend

    store = dist.HashStore()
    dist.init_process_group("frnccl", store=store, rank=0, world_size=1, timeout=timedelta(seconds=600))
    mesh = _mesh_groups(store, args.world, args.tp) if args.world else []
    t = torch.ones(2)
    t0 = time.perf_counter()
    for _ in range(args.ops):
        dist.all_reduce(t)
    fill_s = time.perf_counter() - t0
    time.sleep(0.5)  # the watchdog marks the last ops completed
    walls, cpus, sizes = [], [], []
    for _ in range(args.dumps):
        c0, t0 = time.process_time(), time.perf_counter()
        folder = fr_backend.dump()
        walls.append((time.perf_counter() - t0) * 1e3)
        sizes.append(sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs))
        time.sleep(0.3)  # the monitor frees the dump's tree after the call returned: counted below
        cpus.append((time.process_time() - c0) * 1e3)
    entries = len(fr_backend.trace_entries(symbolize=False)["entries"])
    print(RESULT + json.dumps({"wall_ms": walls, "cpu_ms": cpus, "bytes": sizes, "entries": entries, "fill_s": fill_s}), flush=True)
    if mesh:
        # The mesh groups share the 1-rank group's Gloo and are no torch group: tearing them down is no part of
        # what is measured (destroy_process_group waits on them), so the process ends here.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    dist.destroy_process_group()


def _mesh_groups(store: object, world: int, tp: int) -> list[object]:
    """The last rank's DeviceMesh groups in a ``world``-rank TP x DP job, registered with the recorder as
    init_process_group and DeviceMesh register theirs (their inner backend: the 1-rank group's Gloo; no op
    is issued on them)."""
    import torch
    import torch.distributed as dist

    from fr_backend._native import native

    tp = min(tp, world)
    rank = world - 1
    gloo = dist.group.WORLD._get_backend(torch.device("cpu")).cpu_backend
    groups = {"mesh_world": list(range(world)), "mesh_tp": list(range(rank // tp * tp, rank // tp * tp + tp)),
              "mesh_dp": list(range(rank % tp, world, tp))}
    return [native().FrBackend(store, ranks.index(rank), len(ranks), gloo, None, name, ranks, 600_000)
            for name, ranks in groups.items()]


def run(name: str, extra: dict[str, str], args: argparse.Namespace, dump_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRNCCL_")}
    env.update(FRNCCL_DUMP_DIR=dump_dir, FRNCCL_BUFFER_SIZE=str(args.entries), OMP_NUM_THREADS="1", **extra)
    cmd = [sys.executable, __file__, "--worker", "--ops", str(args.ops), "--dumps", str(args.dumps),
           "--world", str(args.world), "--tp", str(args.tp)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    res = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)][-1][len(RESULT):])
    logged = [(int(m.group(1)), int(m.group(3))) for m in LOG.finditer(proc.stderr)]
    res["monitor_ms"] = [ms for _, ms in logged]
    res["logged_entries"] = [n for n, _ in logged]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=20000, help="FRNCCL_BUFFER_SIZE")
    ap.add_argument("--ops", type=int, default=0, help="ops to issue (default: entries + 500)")
    ap.add_argument("--dumps", type=int, default=7)
    ap.add_argument("--configs", type=str, default="default,default/pickle,default/json,default/pickle+json")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--quick", action="store_true", help="3 dumps")
    ap.add_argument("--worlds", type=str, default="", help="e.g. 2,16384,100000: a DeviceMesh rank's dump per world")
    ap.add_argument("--tp", type=int, default=8, help="TP size of --worlds' mesh")
    ap.add_argument("--world", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.ops = args.ops or args.entries + 500
    if args.quick:
        args.dumps = min(args.dumps, 3)
    if args.worker:
        worker(args)
        return
    if args.worlds:
        worlds(args)
        return
    names = [c for c in args.configs.split(",") if c]
    print(f"{args.entries}-entry ring buffer, {args.ops} all_reduces issued, {args.dumps} dumps per configuration "
          f"(default formats unless named), {os.cpu_count()} CPUs\n")
    print("| configuration | entries | monitor ms (median [min-max]) | dump() wall ms (median) | CPU ms per dump "
          "(median) | bytes per rank dump | B/entry | fill us/op |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="frnccl-bench-dump-") as dump_dir:
        for name in names:
            r = run(name, CONFIGS[name], args, dump_dir)
            mon = r["monitor_ms"]
            mon_s = f"{statistics.median(mon):.0f} [{min(mon)}-{max(mon)}]" if mon else "n/a (no log line)"
            size = statistics.median(r["bytes"])
            print(f"| {name} | {r['entries']} | {mon_s} | {statistics.median(r['wall_ms']):.0f} | "
                  f"{statistics.median(r['cpu_ms']):.0f} | {_size(size)} | {size / max(r['entries'], 1):.1f} | {r['fill_s'] / args.ops * 1e6:.0f} |", flush=True)
            results[name] = size
    if "default" in results:
        print("\nbytes per incident (every rank one dump of this size):\n")
        print("| ranks | " + " | ".join(results) + " |")
        print("| --- |" + " --- |" * len(results))
        for ranks in (1024, 16384, 100_000):
            print(f"| {ranks:,} | " + " | ".join(_size(b * ranks) for b in results.values()) + " |")


def worlds(args: argparse.Namespace) -> None:
    print(f"default configuration, {args.entries}-entry ring buffer; the last rank of a TP x DP DeviceMesh job, "
          f"TP = {args.tp} (or the world size if smaller), {os.cpu_count()} CPUs\n")
    print("| world size | TP x DP | bytes per rank dump | bytes per incident |")
    print("| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="frnccl-bench-dump-") as dump_dir:
        for w in (int(x) for x in args.worlds.split(",") if x):
            args.world = w
            size = statistics.median(run(f"world {w}", {}, args, dump_dir)["bytes"])
            tp = min(args.tp, w)
            print(f"| {w:,} | {tp} x {w // tp} | {_size(size)} | {_size(size * w)} |", flush=True)


def _size(b: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= scale:
            return f"{b / scale:.{1 if b < 100 * scale else 0}f} {unit}"
    return f"{b:.0f} B"


if __name__ == "__main__":
    main()
