"""What frnccl's wrapper costs per op, measured without a network: frnccl around torch's FakeProcessGroup.

    python scripts/bench_wrapper.py [--ops 20000] [--rounds 15] [--configs default,stacks=none,buf=0]
                                    [--device cpu|cuda] [--depth N] [--json FILE]

FakeProcessGroup completes every op at once and moves no data, so its own cost per op is a few
hundred nanoseconds plus the Python binding. Each configuration runs in its own process (frnccl fixes
its configuration per process); inside it, blocks of `--ops` calls to `fake.allreduce([t])` (A) and to
the frnccl backend wrapping that same fake group (B) alternate for `--rounds` rounds. The wrapper's cost
per op is median(B) - median(A): the op path (seq ids, recording, caller stack, the returned Work, the
watchdog's handover) and everything the watchdog thread takes from the caller's core while it runs.

With `--device cuda` the tensor lives on the GPU and the fake group is frnccl's CUDA inner backend, so
the CUDA part of the op path (device lookup, the GPU timing policy) is included; the fake group returns a
Work, so no completion marker is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIGS: dict[str, dict[str, str]] = {
    "default": {},
    "stacks=none": {"FRNCCL_STACKS": "none"},
    "stacks=cpp": {"FRNCCL_STACKS": "cpp"},
    "buf=0": {"FRNCCL_BUFFER_SIZE": "0"},
    "buf=2000": {"FRNCCL_BUFFER_SIZE": "2000"},  # torch's ring size: does the default ring's footprint cost?
}


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import FakeProcessGroup

    from fr_backend._native import native
    from fr_backend._registration import start_runtime
    from fr_backend.config import FrConfig

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(0)
    start_runtime(FrConfig.from_env(), 0, 1)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30))
    # Newer torch only builds it through _create_internal; older torch through the constructor.
    make_fake = getattr(FakeProcessGroup, "_create_internal", None) or FakeProcessGroup
    fake = make_fake(0, 1)
    cpu_inner, cuda_inner = (fake, None) if device.type == "cpu" else (make_fake(0, 1), fake)
    fr = native().FrBackend(store, 0, 1, cpu_inner, cuda_inner, "bench", [0], 600_000)
    t = torch.ones(2, device=device)

    def issue(backend) -> float:
        t0 = time.perf_counter()
        for _ in range(args.ops):
            backend.allreduce([t])
        return (time.perf_counter() - t0) / args.ops * 1e9

    def block(backend, depth: int = args.depth) -> float:
        # Each op is issued under `depth` more Python frames, as from deep inside a training step.
        return issue(backend) if depth <= 0 else block(backend, depth - 1)

    for _ in range(3):  # warm-up: recorder slots, thread-name cache, allocator
        block(fake), block(fr)
    plain, wrapped = [], []
    for r in range(args.rounds):
        order = (fake, fr) if r % 2 == 0 else (fr, fake)
        for backend in order:
            (plain if backend is fake else wrapped).append(block(backend))
    print(json.dumps({"plain_ns": plain, "wrapped_ns": wrapped}))
    fr.shutdown()


def run_config(name: str, args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    env.update(CONFIGS[name])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "python"), env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, __file__, "--worker", "--ops", str(args.ops), "--rounds", str(args.rounds),
           "--device", args.device, "--depth", str(args.depth)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"bench_wrapper: configuration {name} failed (exit {out.returncode}): {tail[0]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    plain, wrapped = statistics.median(result["plain_ns"]), statistics.median(result["wrapped_ns"])
    deltas = [w - p for p, w in zip(result["plain_ns"], result["wrapped_ns"])]
    return {"plain_ns": plain, "wrapped_ns": wrapped, "cost_ns": wrapped - plain,
            "cost_min_ns": min(deltas), "cost_max_ns": max(deltas), "rounds": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=20000, help="calls per block (default 20000)")
    parser.add_argument("--rounds", type=int, default=15, help="A/B block pairs per configuration (default 15)")
    parser.add_argument("--configs", default="default,stacks=none,buf=0",
                        help=f"comma list of {', '.join(CONFIGS)} (default: default,stacks=none,buf=0)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--depth", type=int, default=0,
                        help="extra Python frames above each call, as in a deep training step (default 0)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per configuration (default 300)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ops < 1 or args.rounds < 1 or not 0 <= args.depth <= 500:
        parser.error("--ops and --rounds must be at least 1, --depth between 0 and 500")
    if args.worker:
        worker(args)
        return
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_wrapper: --device cuda needs a CUDA build of torch and a GPU; this torch sees none")
    print(f"device {args.device}, torch {torch.__version__}, {os.cpu_count()} CPUs, {args.depth} extra frames, {args.rounds} rounds x "
          f"{args.ops} ops per block, load average {os.getloadavg()[0]:.1f}", flush=True)
    results = {}
    for name in names:
        started = time.monotonic()
        results[name] = r = run_config(name, args)
        print(f"  {name}: done in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    print("\n| configuration | fake group alone (ns/op) | frnccl around it (ns/op) | frnccl's cost (ns/op) [min-max over rounds] |")
    print("| --- | --- | --- | --- |")
    for name, r in results.items():
        print(f"| {name} | {r['plain_ns']:.0f} | {r['wrapped_ns']:.0f} | {r['cost_ns']:.0f} "
              f"[{r['cost_min_ns']:.0f}-{r['cost_max_ns']:.0f}] |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
