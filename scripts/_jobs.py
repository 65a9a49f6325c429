"""Launching the rank processes of one benchmark job (shared by the bench_*.py scripts)."""

from __future__ import annotations

import json
import socket
import subprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
