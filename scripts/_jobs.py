"""What the bench_*.py scripts share: launching the rank processes of one job, and formatting."""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
from collections.abc import Callable, Iterable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_envs(world: int, dump_dir: str, scrub: tuple[str, ...], extra: dict[str, str]) -> list[dict[str, str]]:
    """Each rank's environment for a local job: a fresh store port; no inherited FRNCCL_* or `scrub` settings; then `extra`."""
    port = free_port()
    envs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith("FRNCCL_") and k not in scrub}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
                   PYTHONUNBUFFERED="1", FRNCCL_DUMP_DIR=dump_dir)
        env.update(extra)
        envs.append(env)
    return envs


def run_ranks(label: str, cmd: list[str], envs: list[dict[str, str]], timeout: float, result_prefix: str) -> dict:
    """Runs one process per env (rank order) and returns the JSON rank 0 printed after `result_prefix`.

    Exits with a one-line reason (and the ranks' output tails) if the job times out, fails or prints no result.
    """
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for env in envs]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise SystemExit(f"{label}: job did not finish in {timeout:.0f} s")
    if any(p.returncode != 0 for p in procs):
        raise SystemExit(f"{label}: job failed:\n" + "\n".join(o[-3000:] for o in outs))
    lines = [ln for ln in outs[0].splitlines() if ln.startswith(result_prefix)]
    if not lines:
        raise SystemExit(f"{label}: job printed no result:\n{outs[0][-3000:]}")
    return json.loads(lines[-1][len(result_prefix):])


def human(size: int) -> str:
    """A byte count as the tables print it: 8 B, 64 KB, 1 MB."""
    for unit, n in (("MB", 1 << 20), ("KB", 1 << 10)):
        if size >= n:
            return f"{size // n} {unit}"
    return f"{size} B"


def size_table(title: str, heads: list[str], rows: list[list[str]], sizes: list[int],
               cell: Callable[[list[str], int], str]) -> list[str]:
    """A markdown table under `title`: the leading columns `heads` (one value each per row), then one
    column per size, filled by cell(row, size)."""
    lines = [title, "", "| " + " | ".join(heads + [human(s) for s in sizes]) + " |",
             "|" + " --- |" * (len(heads) + len(sizes))]
    for row in rows:
        lines.append("| " + " | ".join(row + [cell(row, s) for s in sizes]) + " |")
    return lines


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def parse_sizes(ap: argparse.ArgumentParser, text: str, default: list[int]) -> list[int]:
    """--sizes: comma-separated byte counts, or `default` when empty; a one-line usage error otherwise."""
    try:
        return [int(s) for s in text.split(",")] if text else list(default)
    except ValueError:
        ap.error(f"--sizes must be comma-separated byte counts; got {text!r}")


def parse_names(ap: argparse.ArgumentParser, flag: str, text: str, allowed: Iterable[str]) -> list[str]:
    """A comma-separated list of names from `allowed`; a one-line usage error names any other."""
    allowed = list(allowed)
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        ap.error(f"{flag}: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(allowed)}")
    return names
