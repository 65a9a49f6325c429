#!/usr/bin/env python3
"""Runs torch's own distributed test suite against frnccl and against gloo, and prints the difference.

The suite is `DistributedTest._DistTestBase` from torch/testing/_internal/distributed/distributed_test.py,
on CPU at world size 2 (each test forks its ranks; --start spawn spawns them, as torch's CI does). Its gates
by backend name treat frnccl as gloo (scripts/_peer_suite_case.py says how). Each backend runs in a process
group of its own; the ranks' output goes to a log file per backend.

    python3 scripts/peer_suite.py                       # the whole suite: 1-2 minutes per backend on 2 busy cores
    python3 scripts/peer_suite.py -k barrier -k object  # tests whose name contains one of the words
    python3 scripts/peer_suite.py --tests test_all_reduce_sum,test_barrier --json out.json
    python3 scripts/peer_suite.py --enable-mode           # plain gloo, and gloo under FRNCCL_ENABLE=1

--enable-mode runs the suite as plain gloo twice, the second time with FRNCCL_ENABLE=1 (backend "enable"):
the suite names gloo everywhere and frnccl is turned on from outside, as a user would. Its figures must be
gloo's; each rank dumps at teardown (FRNCCL_DUMP_ON_TEARDOWN=1), and the run fails unless every rank's dumps
hold the suite's ops.

Exit status: 0 when every test has the same outcome on both backends, 1 when some differ (or a backend's
run broke off), 2 on bad input (a test name the suite does not have), 3 when torch's suite cannot be
imported (it needs expecttest and numpy).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

SCRIPTS = Path(__file__).resolve().parent
BACKENDS = ("gloo", "frnccl", "enable")  # enable: gloo, with frnccl turned on by FRNCCL_ENABLE=1
OUTCOMES = ("passed", "failed", "skipped")


@dataclass
class Outcome:
    outcome: str  # one of OUTCOMES
    seconds: float
    detail: str = ""  # the skip reason, or the end of the failure's text


@dataclass
class BackendRun:
    backend: str
    tests: dict[str, Outcome] = field(default_factory=dict)
    seconds: float = 0.0
    incidents: list[str] = field(default_factory=list)  # frnccl dump folders the run left
    dumped_ops: dict[int, int] = field(default_factory=dict)  # rank -> entries in its dumps (enable runs)
    error: str = ""  # why the run gave no result for some tests

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.tests.values() if o.outcome == outcome)


def _suite_env(backend: str, world_size: int, dump_dir: str, start: str = "fork") -> dict[str, str]:
    """The environment torch's suite reads at import (BACKEND: the name its gates see), and the backend under test."""
    env = dict(os.environ)
    if backend == "enable":
        # The suite as plain gloo, with frnccl turned on from outside; every rank dumps as it tears down.
        env.update(FRNCCL_ENABLE="1", FRNCCL_DUMP_ON_TEARDOWN="1")
        backend = "gloo"
    env.update(
        BACKEND="gloo",
        FRNCCL_PEER_SUITE_BACKEND=backend,  # _peer_suite_case.UNDER_TEST_ENV
        FRNCCL_PEER_SUITE_START=start,  # _peer_suite_case.START_ENV
        WORLD_SIZE=str(world_size),
        FRNCCL_DUMP_DIR=dump_dir,
        PYTHONPATH=os.pathsep.join(p for p in (str(SCRIPTS), env.get("PYTHONPATH", "")) if p),
        OMP_NUM_THREADS="1",
        # file://, as torch's CI runs the suite: a few tests (test_barrier_timeout_global) need it, and the
        # suite reads it at import. Each test's own groups use a file of their own either way.
        INIT_METHOD="file://" + str(Path(dump_dir).parent / "init_file"),
        PYTORCH_PRINT_REPRO_ON_FAILURE="0",
    )
    return env


# ---------------------------------------------------------------- child: one backend, in its own process


class _Collector(unittest.TestResult):
    def __init__(self, progress: TextIO | None) -> None:
        super().__init__()
        self.outcomes: dict[str, Outcome] = {}
        self._started = 0.0
        self._progress = progress

    @staticmethod
    def _name(test: unittest.TestCase) -> str:
        return test.id().rsplit(".", 1)[-1]

    def _put(self, test: unittest.TestCase, outcome: str, detail: str = "") -> None:
        name = self._name(test)
        self.outcomes[name] = Outcome(outcome, round(time.monotonic() - self._started, 2), detail.strip()[-2000:])
        if self._progress is not None:
            print(f"  {outcome:7s} {self.outcomes[name].seconds:6.1f}s {name}", file=self._progress, flush=True)

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        self._started = time.monotonic()

    def addSuccess(self, test: unittest.TestCase) -> None:
        self._put(test, "passed")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        self._put(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        self._put(test, "failed", self._exc_info_to_string(err, test))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        self._put(test, "skipped", reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
        self._put(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        self._put(test, "failed", "unexpected success")


def _child(out: Path, names: list[str], progress_fd: int | None) -> int:
    from _peer_suite_case import PeerSuite  # noqa: PLC0415 (needs the environment _suite_env sets)

    suite = unittest.TestSuite(PeerSuite(name) for name in names)
    progress = os.fdopen(progress_fd, "w") if progress_fd is not None else None
    result = _Collector(progress)
    suite.run(result)
    out.write_text(json.dumps({name: asdict(o) for name, o in result.outcomes.items()}))
    return 0


def _all_names() -> list[str]:
    from _peer_suite_case import PeerSuite  # noqa: PLC0415

    return list(unittest.TestLoader().getTestCaseNames(PeerSuite))


# ---------------------------------------------------------------- parent


def _bad_input(message: str) -> SystemExit:
    print(f"peer_suite: {message}", file=sys.stderr)
    return SystemExit(2)


def _select(all_names: list[str], tests: list[str], words: list[str]) -> list[str]:
    unknown = [t for t in tests if t not in all_names]
    if unknown:
        raise _bad_input(f"not a test of DistributedTest._DistTestBase: {', '.join(unknown)}")
    if not tests and not words:
        return all_names
    return [n for n in all_names if n in tests or any(w in n for w in words)]


def _command(args: list[str]) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


def list_tests(world_size: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="frnccl-peer-") as tmp:
        proc = subprocess.run(_command(["--child-list"]), env=_suite_env("gloo", world_size, tmp), timeout=600,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [""])[-1]
        print(f"peer_suite: could not import torch's distributed test suite ({tail}); it needs expecttest and numpy",
              file=sys.stderr)
        raise SystemExit(3)
    return json.loads(proc.stdout)


def _run_child(args: list[str], env: dict[str, str], log: Path, progress: bool, timeout: float | None) -> int:
    """Runs one backend's child with its output (the ranks' logs) in `log`; echoes its progress lines.
    Past `timeout` seconds the child and every rank it started are killed (its own process group)."""
    read_fd, write_fd = os.pipe()
    with open(log, "w") as log_file:
        proc = subprocess.Popen(_command([*args, "--progress-fd", str(write_fd)]), env=env, stdin=subprocess.DEVNULL,
                                stdout=log_file, stderr=subprocess.STDOUT, pass_fds=(write_fd,),
                                start_new_session=True)
    os.close(write_fd)

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    # The pipe ends when the child and every rank it forked are gone.
    timer = threading.Timer(timeout, kill) if timeout is not None else None
    if timer is not None:
        timer.start()
    with os.fdopen(read_fd) as lines:
        for line in lines:
            if progress:
                print(line, end="", flush=True)
    code = proc.wait()
    if timer is not None:
        timer.cancel()
    return code


def run_backend(backend: str, names: list[str], world_size: int, start: str, progress: bool,
                timeout: float | None, logs: Path) -> BackendRun:
    run = BackendRun(backend)
    with tempfile.TemporaryDirectory(prefix=f"frnccl-peer-{backend}-") as tmp:
        out = Path(tmp) / "outcomes.json"
        dumps = Path(tmp) / "dumps"
        started = time.monotonic()
        code = _run_child(["--child", str(out), "--tests", ",".join(names)],
                          _suite_env(backend, world_size, str(dumps), start), logs / f"{backend}.log", progress, timeout)
        run.seconds = round(time.monotonic() - started, 1)
        if timeout is not None and run.seconds >= timeout:
            run.error = f"the {backend} run was stopped after {timeout} s"
        elif code != 0:
            run.error = f"the {backend} run exited with {code}"
        if out.exists():
            run.tests = {n: Outcome(**o) for n, o in json.loads(out.read_text()).items()}
        if dumps.is_dir():
            run.incidents = sorted(p.name for p in dumps.iterdir() if p.is_dir())
            if backend == "enable":
                run.dumped_ops = dumped_ops(dumps)
                missing = [r for r in range(world_size) if run.dumped_ops.get(r, 0) == 0]
                if missing and not run.error:
                    run.error = f"no op in the dumps of rank(s) {missing} under FRNCCL_ENABLE=1"
        elif backend == "enable" and not run.error:
            run.error = "no dump under FRNCCL_ENABLE=1"
    for name in names:
        if name not in run.tests:
            run.tests[name] = Outcome("failed", 0.0, run.error or "no result")
    return run


def dumped_ops(dumps: Path) -> dict[int, int]:
    """Rank -> entries in all its dump files under `dumps`."""
    from fr_backend import load_dump  # noqa: PLC0415 (only enable runs need frnccl here)

    counts: dict[int, int] = {}
    for path in sorted(dumps.glob("*/compact/frnccl_rank_*.json.gz")):
        dump = load_dump(str(path))
        rank = int(dump["rank"])
        counts[rank] = counts.get(rank, 0) + len(dump.get("entries") or [])
    return counts


def differences(runs: dict[str, BackendRun]) -> list[str]:
    names = sorted(set().union(*(r.tests for r in runs.values())))
    return [n for n in names if len({r.tests[n].outcome for r in runs.values()}) > 1]


def report(runs: dict[str, BackendRun]) -> str:
    lines = [f"{'backend':8s} {'passed':>6s} {'failed':>6s} {'skipped':>7s} {'seconds':>8s}  frnccl incidents"]
    for b, r in runs.items():
        counts = " ".join(f"{r.count(o):>{max(6, len(o))}d}" for o in OUTCOMES)
        ops = f"  ops dumped per rank: {[r.dumped_ops.get(k, 0) for k in sorted(r.dumped_ops)]}" if r.dumped_ops else ""
        lines.append(f"{b:8s} {counts} {r.seconds:8.1f}  {len(r.incidents)}{ops}" + (f"  ({r.error})" if r.error else ""))
    diff = differences(runs)
    lines.append(f"tests whose outcome differs: {len(diff)}")
    for name in diff:
        lines.append(f"  {name}: " + ", ".join(f"{b} {r.tests[name].outcome}" for b, r in runs.items()))
        for b, r in runs.items():
            o = r.tests[name]
            if o.outcome != "passed" and o.detail:
                lines.append(f"    {b}: {why(o.detail)}")
    return "\n".join(lines)


def why(detail: str) -> str:
    """The line of a failure that says what failed: the last exception line, else the last line."""
    text = [ln.strip() for ln in detail.splitlines() if ln.strip()]
    errors = [ln for ln in text if re.match(r"^[\w.]*(Error|Exception|Timeout)\b.*:", ln)]
    return (errors or text or [""])[-1][:300]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", default="", help="comma-separated test names (test_...)")
    ap.add_argument("-k", dest="words", action="append", default=[], help="run the tests whose name contains this")
    ap.add_argument("--backends", default="gloo,frnccl", help="default: gloo,frnccl; enable: gloo under FRNCCL_ENABLE=1")
    ap.add_argument("--enable-mode", action="store_true", help="the same as --backends gloo,enable")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--start", choices=("fork", "spawn"), default="fork",
                    help="how each test's ranks start: fork (default, fast) or spawn (as torch's CI does)")
    ap.add_argument("--json", type=Path, help="write every test's outcome per backend here")
    ap.add_argument("--timeout", type=float, default=None, help="seconds allowed per backend")
    ap.add_argument("--list", action="store_true", help="print the suite's test names and exit")
    ap.add_argument("--progress", action="store_true", help="print each test's outcome as it ends")
    ap.add_argument("--logs", type=Path, help="folder for each backend's log (the ranks' output); default: a new "
                    "folder under the temporary directory")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--progress-fd", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-list", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    tests = [t for t in args.tests.split(",") if t]
    if args.child_list:
        print(json.dumps(_all_names()))
        return 0
    if args.child:
        return _child(args.child, tests, args.progress_fd)

    backends = ["gloo", "enable"] if args.enable_mode else [b for b in args.backends.split(",") if b]
    bad = [b for b in backends if b not in BACKENDS]
    if bad or not backends:
        raise _bad_input(f"--backends takes gloo, frnccl and/or enable, not {','.join(bad) or 'nothing'}")
    if args.world_size < 2:
        raise _bad_input(f"--world-size must be at least 2, not {args.world_size}")
    names = _select(list_tests(args.world_size), tests, args.words)
    if not names:
        raise _bad_input("no test of the suite matches " + " ".join(args.words))
    print(f"peer_suite: {len(names)} tests, world size {args.world_size}, ranks by {args.start}, "
          f"backends {','.join(backends)}", flush=True)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="frnccl-peer-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    runs = {b: run_backend(b, names, args.world_size, args.start, args.progress, args.timeout, logs) for b in backends}
    print(report(runs))
    print(f"logs: {logs}")
    if args.json:
        args.json.write_text(json.dumps({b: asdict(r) for b, r in runs.items()}, indent=1))
    return 1 if differences(runs) or any(r.error for r in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
