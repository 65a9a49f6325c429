#!/usr/bin/env python3
"""Where frnccl's extra CPU per op goes: a perf profile of bench_paired.py, split by its A/B blocks.

    perf record -e cpu-clock -F 9999 -k CLOCK_MONOTONIC -o paired.data -- \\
        python3 scripts/bench_paired.py --mode gpu --configs default --sizes 8 --rounds 60 --block-log blocks
    perf script -i paired.data -F pid,tid,time,period,ip,sym,dso --ns > paired.txt
    python3 scripts/perf_by_block.py blocks paired.txt [--top 40]

With `--call-graph dwarf` at the record (and `--no-inline` at `perf script`, which is otherwise very slow),
`--callers REGEX` also splits the time of the code REGEX names by the call path into it, and
`--under NAME=REGEX` (repeatable) gives the time spent below the frames REGEX names, e.g. frnccl's op path
(`frnccl::FrBackend::allreduce`) less the inner group's (`ProcessGroupNCCL::allreduce`).

bench_paired.py runs a plain group's and frnccl's group's blocks alternately in the same processes, and
with `--block-log` it writes when each synchronous block ran, on which thread. This script gives every
sample of that thread to the block it fell in (both clocks are CLOCK_MONOTONIC), weighs it by its period
(cpu-clock counts nanoseconds of CPU), and prints, per configuration and size, the calling thread's CPU per
op in each arm by shared object and by symbol, largest difference first. Samples outside every block
(start-up, warm-up, barriers) are left out. A sample is one period of CPU: symbols under about
period / ops-per-arm are noise, and the totals should match bench_paired.py's own "calling thread CPU".
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# A sample's first line: "  1234/1235 67408.509007171:     100100 ffffffff815e1560 unmap_page_range ([kernel.kallsyms])";
# recorded with --call-graph, the frames follow on lines of their own, leaf first, up to a blank line.
HEADER = re.compile(r"^\s*(\d+)/(\d+)\s+(\d+)\.(\d{9}):\s+(\d+)\s*(.*)$")
FRAME = re.compile(r"^\s*[0-9a-f]+\s+(.*?)\s+\(([^()]*)\)\s*$")


@dataclass
class Sample:
    pid: int
    tid: int
    when_ns: int
    period: int
    frames: list[tuple[str, str]]  # (symbol, shared object), leaf first


def read_samples(lines) -> tuple[list[Sample], int]:
    """Samples from `perf script` output, with or without call chains; and the count of lines not understood."""
    samples: list[Sample] = []
    unread = 0
    current: Sample | None = None
    for line in lines:
        header = HEADER.match(line)
        if header:
            current = Sample(int(header.group(1)), int(header.group(2)),
                             int(header.group(3)) * 1_000_000_000 + int(header.group(4)), int(header.group(5)), [])
            samples.append(current)
            line = header.group(6)
            if not line.strip():
                continue
        frame = FRAME.match(line)
        if frame and current is not None:
            current.frames.append((frame.group(1), frame.group(2).rsplit("/", 1)[-1]))
        elif line.strip():
            unread += 1
    return samples, unread


@dataclass
class Block:
    start_ns: int
    end_ns: int
    tid: int
    key: tuple[str, int, str]  # configuration, size, arm
    iters: int


@dataclass
class Arm:
    ops: int = 0
    by_symbol: Counter = field(default_factory=Counter)  # (dso, symbol) -> ns of CPU
    by_dso: Counter = field(default_factory=Counter)
    by_caller: Counter = field(default_factory=Counter)  # call path into --callers' code -> ns of CPU
    under: Counter = field(default_factory=Counter)  # --under name -> ns of CPU with a matching frame on the stack


def callers_of(frames: list[tuple[str, str]], pattern: re.Pattern, depth: int) -> tuple[str, ...] | None:
    """For a sample whose leaf frame matches `pattern` ("symbol (object)"), the `depth` frames that called
    into the matching code, innermost first; None when the leaf does not match."""
    if not frames or not pattern.search(f"{frames[0][0]} ({frames[0][1]})"):
        return None
    i = 0
    while i < len(frames) and pattern.search(f"{frames[i][0]} ({frames[i][1]})"):
        i += 1
    return tuple(f"{sym[:60]} ({dso})" for sym, dso in frames[i:i + depth]) or ("(no caller recorded)",)


def load_blocks(folder: Path) -> dict[int, list[Block]]:
    """Blocks by process id, sorted by start, from <folder>/<configuration>/rank<R>.jsonl."""
    by_pid: dict[int, list[Block]] = defaultdict(list)
    files = sorted(folder.glob("*/rank*.jsonl"))
    if not files:
        raise SystemExit(f"perf_by_block: no <configuration>/rank<R>.jsonl files under {folder} "
                         "(run bench_paired.py with --block-log)")
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            try:
                b = json.loads(line)
                block = Block(int(b["start_ns"]), int(b["end_ns"]), int(b["tid"]),
                              (path.parent.name, int(b["size"]), str(b["arm"])), int(b["iters"]))
                by_pid[int(b["pid"])].append(block)
            except (ValueError, KeyError, TypeError) as e:
                raise SystemExit(f"perf_by_block: {path}:{n}: not a block record ({e})")
    for blocks in by_pid.values():
        blocks.sort(key=lambda b: b.start_ns)
    return by_pid


def attribute(samples: list[Sample], by_pid: dict[int, list[Block]], callers: re.Pattern | None,
              depth: int, under: dict[str, re.Pattern]) -> tuple[dict[tuple, Arm], int]:
    """Adds each calling-thread sample to its block's arm; returns the arms and the samples used."""
    arms: dict[tuple, Arm] = defaultdict(Arm)
    starts = {pid: [b.start_ns for b in blocks] for pid, blocks in by_pid.items()}
    for blocks in by_pid.values():
        for b in blocks:
            arms[b.key].ops += b.iters
    used = 0
    for sample in samples:
        blocks = by_pid.get(sample.pid)
        if not blocks or not sample.frames:
            continue
        i = bisect.bisect_right(starts[sample.pid], sample.when_ns) - 1
        if i < 0 or sample.when_ns > blocks[i].end_ns or sample.tid != blocks[i].tid:
            continue
        arm = arms[blocks[i].key]
        symbol, dso = sample.frames[0]
        arm.by_symbol[(dso, symbol[:110])] += sample.period
        arm.by_dso[dso] += sample.period
        if callers is not None:
            path = callers_of(sample.frames, callers, depth)
            if path is not None:
                arm.by_caller[path] += sample.period
        for name, pattern in under.items():
            if any(pattern.search(frame_symbol) for frame_symbol, _ in sample.frames):
                arm.under[name] += sample.period
        used += 1
    return arms, used


def table(title: str, plain: Counter, frnccl: Counter, plain_ops: int, frnccl_ops: int, top: int, label) -> list[str]:
    per_op = lambda c, k, ops: c.get(k, 0) / ops / 1000  # ns of CPU -> µs per op
    rows = sorted(set(plain) | set(frnccl),
                  key=lambda k: -abs(per_op(frnccl, k, frnccl_ops) - per_op(plain, k, plain_ops)))
    lines = [title, "", "| plain µs/op | frnccl µs/op | difference | where |", "| --- | --- | --- | --- |"]
    for k in rows[:top]:
        a, b = per_op(plain, k, plain_ops), per_op(frnccl, k, frnccl_ops)
        lines.append(f"| {a:.3f} | {b:.3f} | {b - a:+.3f} | {label(k)} |")
    return lines


def report(arms: dict[tuple, Arm], top: int) -> str:
    out = []
    for config, size in sorted({(k[0], k[1]) for k in arms}):
        plain, frnccl = arms.get((config, size, "plain")), arms.get((config, size, "frnccl"))
        if not plain or not frnccl or not plain.ops or not frnccl.ops:
            continue
        total = lambda arm: sum(arm.by_dso.values()) / arm.ops / 1000
        out.append(f"## {config}, {size} B: calling thread CPU per op, plain {total(plain):.2f} µs -> frnccl "
                   f"{total(frnccl):.2f} µs ({total(frnccl) - total(plain):+.2f}); {plain.ops} and {frnccl.ops} ops")
        out.append("")
        out += table("By shared object", plain.by_dso, frnccl.by_dso, plain.ops, frnccl.ops, 12, lambda k: k)
        out.append("")
        out += table(f"By symbol, the {top} largest differences", plain.by_symbol, frnccl.by_symbol, plain.ops,
                     frnccl.ops, top, lambda k: f"{k[1]} ({k[0]})")
        out.append("")
        if plain.under or frnccl.under:
            out += table("Inclusive time under the frames --under names", plain.under, frnccl.under, plain.ops,
                         frnccl.ops, len(plain.under | frnccl.under), lambda k: k)
            out.append("")
        if plain.by_caller or frnccl.by_caller:
            out += table(f"Who called into the code --callers names, the {top} largest differences", plain.by_caller,
                         frnccl.by_caller, plain.ops, frnccl.ops, top, lambda k: " <- ".join(k))
            out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("blocks", type=Path, help="the folder given to bench_paired.py --block-log")
    ap.add_argument("samples", help="`perf script -F pid,tid,time,period,ip,sym,dso --ns` output, or - for stdin")
    ap.add_argument("--top", type=int, default=40, help="symbols per table (default 40)")
    ap.add_argument("--callers", default="", metavar="REGEX",
                    help="for samples recorded with --call-graph: split the time of code whose \"symbol (object)\" "
                         "matches REGEX by the call path into it, e.g. 'libcuda|~WorkNCCL'")
    ap.add_argument("--depth", type=int, default=5, help="caller frames per path with --callers (default 5)")
    ap.add_argument("--under", action="append", default=[], metavar="NAME=REGEX",
                    help="for samples recorded with --call-graph: the time spent with a frame whose symbol matches "
                         "REGEX on the stack, e.g. 'frnccl=frnccl::FrBackend::allreduce'; may be repeated")
    args = ap.parse_args()
    if not args.blocks.is_dir():
        ap.error(f"blocks: {args.blocks} is not a folder")
    if args.top < 1 or args.depth < 1:
        ap.error("--top and --depth must be at least 1")
    try:
        callers = re.compile(args.callers) if args.callers else None
    except re.error as e:
        ap.error(f"--callers: not a regular expression: {e}")
    under: dict[str, re.Pattern] = {}
    for spec in args.under:
        name, sep, regex = spec.partition("=")
        if not sep or not name or not regex:
            ap.error(f"--under: expected NAME=REGEX; got {spec!r}")
        try:
            under[name] = re.compile(regex)
        except re.error as e:
            ap.error(f"--under {name}: not a regular expression: {e}")
    by_pid = load_blocks(args.blocks)
    try:
        source = sys.stdin if args.samples == "-" else open(args.samples, errors="replace")
    except OSError as e:
        ap.error(f"samples: cannot read {args.samples}: {e.strerror}")
    with source:
        samples, unread = read_samples(source)
    arms, used = attribute(samples, by_pid, callers, args.depth, under)
    if used == 0:
        raise SystemExit("perf_by_block: no sample fell in a block: were the samples recorded with "
                         "`-k CLOCK_MONOTONIC` and printed with `-F pid,tid,time,period,ip,sym,dso --ns`?")
    print(f"{used} samples in blocks" + (f"; {unread} lines not read as samples" if unread else ""))
    print()
    print(report(arms, args.top))


if __name__ == "__main__":
    main()
