"""Runs a worker script as N real ranks, one process each, with a hard time bound.

Every rank is a fresh `python` process started with the env:// variables
(MASTER_ADDR=127.0.0.1, a free MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE), so `init_process_group(init_method="env://")` builds a real
TCPStore hosted by rank 0. Each rank runs in its own session; on timeout every
rank's process group is killed and the test fails with all ranks' output.

A worker reports structured results by printing one line
`RESULT <json>` (see workers/_worker.py); `Job.results()` collects them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest

TEST_DIR = Path(__file__).resolve().parent
WORKERS = TEST_DIR / "workers"
RESULT_PREFIX = "RESULT "


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Rank:
    rank: int
    returncode: int | None
    output: str
    exited_mono: float | None = None  # time.monotonic() when the process was seen gone

    def done_mono(self) -> float | None:
        """The value of the last `DONE_MONO <t>` line the rank printed (its last act)."""
        vals = [float(ln.split()[1]) for ln in self.output.splitlines() if ln.startswith("DONE_MONO ")]
        return vals[-1] if vals else None

    def exit_lag_s(self) -> float | None:
        """Seconds from the script's last line to the process being gone."""
        done = self.done_mono()
        return None if done is None or self.exited_mono is None else self.exited_mono - done


@dataclass
class Job:
    ranks: list[Rank]
    elapsed_s: float
    timed_out: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        parts = [f"job took {self.elapsed_s:.1f}s{' (TIMED OUT)' if self.timed_out else ''}"]
        for r in self.ranks:
            parts.append(f"----- rank {r.rank} exit={r.returncode} -----\n{r.output.rstrip()}")
        return "\n".join(parts)

    def assert_ok(self) -> "Job":
        if self.timed_out or any(r.returncode != 0 for r in self.ranks):
            pytest.fail("distributed job failed\n" + self.describe(), pytrace=False)
        return self

    def results(self) -> list[dict[str, Any]]:
        """One parsed RESULT dict per rank, in rank order (fails if a rank printed none)."""
        out = []
        for r in self.ranks:
            lines = [ln for ln in r.output.splitlines() if ln.startswith(RESULT_PREFIX)]
            if len(lines) != 1:
                pytest.fail(f"rank {r.rank} printed {len(lines)} RESULT lines\n" + self.describe(), pytrace=False)
            out.append(json.loads(lines[0][len(RESULT_PREFIX):]))
        return out


def _env(rank: int, world_size: int, port: int, extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        PYTHONUNBUFFERED="1",
        PYTHONFAULTHANDLER="1",
        OMP_NUM_THREADS="1",
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(WORKERS), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


def _kill(procs: Sequence[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def run_commands(cmds: Sequence[Sequence[str]], envs: Sequence[dict[str, str]], timeout: float,
                 cwd: str | None = None) -> Job:
    """Start one process per command (own session each, in `cwd`, else the checkout), wait for all up to
    `timeout` seconds."""
    logs = [tempfile.TemporaryFile(mode="w+b") for _ in cmds]
    procs: list[subprocess.Popen] = []
    start = time.monotonic()
    timed_out = False
    exited: dict[int, float] = {}  # index -> time.monotonic() when seen gone
    try:
        for cmd, env, log in zip(cmds, envs, logs):
            procs.append(
                subprocess.Popen(
                    list(cmd), env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, cwd=cwd or str(TEST_DIR.parent),
                )
            )
        deadline = start + timeout
        # A list, not a generator: every process is polled each round, so a rank that dies while an earlier
        # one still runs is noticed (returncode, exit time) at once.
        while any([p.poll() is None for p in procs]):
            for i, p in enumerate(procs):
                if p.returncode is not None:
                    exited.setdefault(i, time.monotonic())
            if time.monotonic() > deadline:
                timed_out = True
                break
            # One rank died: give the others a moment to notice, then stop them.
            if any(p.returncode not in (None, 0) for p in procs):
                deadline = min(deadline, time.monotonic() + 15)
            time.sleep(0.05)
        for i, p in enumerate(procs):
            if p.poll() is not None:
                exited.setdefault(i, time.monotonic())
    finally:
        _kill(procs)
    elapsed = time.monotonic() - start
    ranks = []
    for i, (p, log) in enumerate(zip(procs, logs)):
        log.seek(0)
        ranks.append(Rank(i, p.returncode, log.read().decode(errors="replace"), exited.get(i)))
        log.close()
    return Job(ranks, elapsed, timed_out)


def run_ranks(
    script: str | Path,
    world_size: int,
    *args: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> Job:
    """Run `workers/<script>` (or a path) as `world_size` ranks over env:// on 127.0.0.1."""
    path = Path(script)
    if not path.is_absolute():
        path = WORKERS / path
    for attempt in range(2):
        port = free_port()
        job = run_commands(
            [[sys.executable, str(path), *args] for _ in range(world_size)],
            [_env(r, world_size, port, env) for r in range(world_size)],
            timeout,
        )
        # The free port can be taken between probing and rank 0 binding it: retry once.
        if attempt == 0 and "EADDRINUSE" in job.ranks[0].output and job.ranks[0].returncode != 0:
            continue
        return job
    return job


class JobThread:
    """A job (`launch` returns its Job) run in a thread, so the test can act on it while it runs."""

    def __init__(self, launch: Callable[[], Job]) -> None:
        self.job: Job | None = None
        self.error: BaseException | None = None

        def target() -> None:
            try:
                self.job = launch()
            except BaseException as err:  # surfaced by finish()
                self.error = err

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def finish(self, timeout: float = 200) -> Job:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the job's launcher did not return within its own bound"
        if self.error is not None:
            raise self.error
        assert self.job is not None
        return self.job


def wait_for(cond: Callable[[], bool], timeout: float, what: str, bg: JobThread | None = None,
             poll_s: float = 0.05) -> None:
    """Polls `cond` until it holds; fails the test after `timeout` s, or at once if `bg`'s job ended."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        if bg is not None and not bg.thread.is_alive():
            pytest.fail(f"the job ended while waiting for {what}\n" + (bg.job.describe() if bg.job else ""), pytrace=False)
        time.sleep(poll_s)
    pytest.fail(f"timed out after {timeout}s waiting for {what}", pytrace=False)


def plain(value: Any) -> Any:
    """Tuples to lists, recursively: what a JSON round trip makes of a pickled dump."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value
