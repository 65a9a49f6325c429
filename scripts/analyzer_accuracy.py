#!/usr/bin/env python3
"""Accuracy of `frnccl analyze` and torch's fr_trace on the multi-host shapes of analyzer/synth.py.

Each shape is generated at 16 and 64 ranks with host clocks off by up to +-5 ms, written as frnccl
dumps and as torch 2.10 dumps, and judged:
  healthy    : right when nothing is blamed (no fault, no straggler);
  straggler  : right when no fault is found and the one straggler named is the slow rank (fr_trace has no
               straggler notion: right when it blames nobody, since a straggler is not a fault);
  skip_go_on : right when the first fault names exactly the rank that skipped, and no finding names another;
  async_p2p  : the same for the rank stuck in compute after its peer's isend;
  several    : independent faults in one step (skips, a compute hang, a size mismatch): right when the faults
               name every culprit (in one finding or several), no other rank, and no culprit as a victim.
fr_trace is blamed for every rank it prints as missing ("missing ranks: {..}") or as "Culprit rank N".
Prints a markdown table (the one in docs/analyzer.md).

usage: PYTHONPATH=python python scripts/analyzer_accuracy.py [--sizes 16 64] [--skip-torch]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

from fr_backend.analyzer import synth  # noqa: E402
from fr_backend.analyzer.fmt import rank_word  # noqa: E402
from fr_backend.analyzer.report import run  # noqa: E402

SHAPES: dict[str, Callable[[int], tuple[Any, list[int]]]] = {
    "healthy, clocks +-5 ms": lambda n: synth.healthy_mesh(n, offset_ms=5.0),
    "straggler, clocks +-5 ms": lambda n: synth.straggler_mesh(n, n // 2 + 1, offset_ms=5.0),
    "skip and go on (TP x DP)": lambda n: synth.mesh_skip(n, n - 3, offset_ms=5.0),
    "async send, peer in compute": lambda n: synth.pipeline_async(n, 5, offset_ms=5.0),
    "several faults: two skips in two TP groups": lambda n: synth.mesh_faults(n, {1: "skip", n - 3: "skip"}),
    "several faults: skip + compute hang": lambda n: synth.mesh_faults(n, {1: "skip", n - 3: "hang"}),
    "several faults: skip + size mismatch": lambda n: synth.mesh_faults(n, {1: "skip", n - 3: "size"}),
    "several faults: skip + skip + compute hang": lambda n: synth.mesh_faults(n, {1: "skip", 6: "skip",
                                                                                  n - 3: "hang"}),
}


def _who(ranks: list[int]) -> str:
    return rank_word(ranks) if ranks else "no rank"


def judge_ours(path: str, shape: str, culprits: list[int]) -> str:
    a = run([path], jobs=1)
    faults = [f for f in a.findings if f.is_fault]
    slow = [f.culprit_ranks for f in a.findings if f.kind == "straggler"]
    if shape.startswith("healthy"):
        ok = not faults and not slow
        said = "nothing" if ok else ", ".join(f"{f.kind} {_who(f.culprit_ranks)}" for f in faults + [
            f for f in a.findings if f.kind == "straggler"])
    elif shape.startswith("straggler"):
        ok = not faults and slow == [culprits]
        said = ", ".join(f"{f.kind} {_who(f.culprit_ranks)}" for f in faults) or "straggler " + ", ".join(_who(x) for x in slow)
    elif shape.startswith("several"):
        # every culprit named (in one finding or several), no innocent, no culprit called a victim
        named = {r for f in faults for r in f.culprit_ranks}
        victims = {r for f in a.findings for r in f.victims}
        innocent = [f for f in a.findings if (f.is_fault or f.kind == "straggler") and set(f.culprit_ranks) - set(culprits)]
        ok = named == set(culprits) and not innocent and not victims & set(culprits)
        said = "; ".join(f"{f.kind} {_who(f.culprit_ranks)}" for f in faults) or "nothing"
    else:
        innocent = [f for f in a.findings if (f.is_fault or f.kind == "straggler") and set(f.culprit_ranks) - set(culprits)]
        ok = bool(faults) and faults[0].culprit_ranks == culprits and not innocent
        said = f"{faults[0].kind} {_who(faults[0].culprit_ranks)}" if faults else "nothing"
    return f"{'right' if ok else 'WRONG'} ({said})"


def judge_torch(path: str, shape: str, culprits: list[int]) -> str:
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    try:
        p = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", path],
                           capture_output=True, text=True, env=env, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        return "WRONG (no verdict in 600 s)"
    if p.returncode:
        return f"WRONG (exit {p.returncode})"
    out = p.stdout + p.stderr  # it reports through logging, on stderr
    blamed: set[int] = set()
    for m in re.finditer(r"missing ranks: \{([\d, ]*)\}", out):
        blamed |= {int(x) for x in m.group(1).split(",") if x.strip()}
    blamed |= {int(x) for x in re.findall(r"Culprit rank (\d+)", out)}
    want = set() if shape.startswith(("healthy", "straggler")) else set(culprits)
    ok = blamed == want
    said = rank_word(blamed) if blamed else "nothing"
    return f"{'right' if ok else 'WRONG'} (blames {said})"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--skip-torch", action="store_true")
    a = ap.parse_args()
    print("| shape | ranks | frnccl analyze (frnccl dumps) | frnccl analyze (torch dumps) | torch fr_trace |")
    print("|-------|-------|-------------------------------|------------------------------|----------------|")
    wrong = 0
    for shape, make in SHAPES.items():
        for n in a.sizes:
            job, culprits = make(n)
            with tempfile.TemporaryDirectory() as d:
                ours = judge_ours(job.write(os.path.join(d, "fr")), shape, culprits)
                ours_t = judge_ours(job.write(os.path.join(d, "torch"), "torch"), shape, culprits)
                theirs = "not run" if a.skip_torch else judge_torch(os.path.join(d, "torch"), shape, culprits)
            wrong += ours.startswith("WRONG")
            print(f"| {shape} | {n} | {ours} | {ours_t} | {theirs} |")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
