"""`frnccl demo`: a CPU job that hangs, is caught, dumped and explained.

It launches `fr_backend._demo_job` on N ranks through torchrun, streams the
interesting lines (progress, the watchdog's timeout, the coordinated dump, the verdict),
then runs the analyzer on the dumps and writes the merged trace and the HTML
report.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# What the user should see from the job's output, and how to show it.
_SHOWN = (
    (re.compile(r"\[demo\] (step .*)"), "progress  {0}"),
    (re.compile(r"\[frnccl rank (\d+)\] (timeout on .*?); asking all"), "watchdog  rank {0}: {1}"),
    (re.compile(r"\[frnccl rank (\d+)\] (error on .*?); asking all"), "watchdog  rank {0}: {1}"),
    (re.compile(r"\[frnccl rank (\d+)\] SIGABRT: .*; asking all"), "abort     rank {0} is aborting; it asks every rank to dump first"),
    (re.compile(r"\[frnccl rank \d+\] (dump \S+: \d+/\d+ ranks wrote.*)"), "dump      {0}"),
    # The trigger's verdict, as it prints it (the ranks' errors repeat its first line after a "[rankN]:").
    (re.compile(r"^(frnccl: (?:verdict: |rank \d+ is at |rank \d+'s ).*)"), "verdict   {0}"),
)


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("demo", help="run a small CPU job that hangs, and watch frnccl catch and explain it")
    p.add_argument("--ranks", type=int, default=4, help="number of ranks (2-16, default 4)")
    p.add_argument("--fault", choices=("skip", "mismatch", "none"), default="skip",
                   help="skip: the last rank gets stuck before a collective; mismatch: it sends a wrong size; none: healthy run")
    p.add_argument("--out", default=None, help="folder for dumps, trace and report (default: a new temp folder)")
    p.add_argument("--timeout", type=float, default=5.0, help="collective timeout of the job in seconds (default 5)")
    p.set_defaults(func=run)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _say(text: str) -> None:
    print(f"frnccl demo | {text}", flush=True)


def _launch(args: argparse.Namespace, out: Path, log_path: Path) -> int:
    env = dict(os.environ)
    env.update(
        FRNCCL_DUMP_DIR=str(out / "dumps"),
        FRNCCL_DUMP_TIMEOUT_SEC="30",
        FRNCCL_COORD_CHECK_MS="250",
        FRNCCL_DEMO_FAULT=args.fault,
        FRNCCL_DEMO_TIMEOUT_SEC=str(args.timeout),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    port = _free_port()
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc-per-node={args.ranks}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
        "--max-restarts=0", "--monitor-interval=0.5",
        "-m", "fr_backend._demo_job",
    ]
    _say(f"launching {args.ranks} ranks with torchrun (fault: {args.fault}, collective timeout {args.timeout:g} s)")
    # The job's own bound: its timeout, the dump deadline and start-up, with room to spare.
    deadline = time.monotonic() + args.timeout + 30 + 60
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                for pattern, shown in _SHOWN:
                    match = pattern.search(line)
                    if match:
                        _say(shown.format(*match.groups()))
                if time.monotonic() > deadline:
                    raise TimeoutError
            return proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except (TimeoutError, subprocess.TimeoutExpired):
            _say("the job did not end in time; stopping it")
            return -1
        finally:
            # Leave nothing running, whatever happened.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def run(args: argparse.Namespace) -> int:
    if not 2 <= args.ranks <= 16:
        print("frnccl: --ranks must be between 2 and 16", file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="frnccl-demo-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    log_path = out / "job.log"
    code = _launch(args, out, log_path)
    _say(f"job ended with exit code {code} after {time.monotonic() - started:.0f} s (full log: {log_path})")

    dumps = out / "dumps"
    if args.fault == "none":
        if code != 0:
            _say("the healthy run failed; see the log")
            return 1
        _say("healthy run: no timeout, no dump")
        return 0
    if not dumps.is_dir() or not any(dumps.iterdir()):
        _say(f"no dump was written under {dumps}")
        return 1

    from .analyzer.cli import main as cli_main

    _say("analyzing the dumps:")
    print(flush=True)
    verdict = cli_main(["analyze", str(dumps)])
    print(flush=True)
    trace_path, report_path = out / "merged_trace.json", out / "report.html"
    cli_main(["trace", str(dumps), "-o", str(trace_path)])
    cli_main(["report", str(dumps), "-o", str(report_path)])
    _say(f"dumps:        {dumps}")
    _say(f"merged trace: {trace_path}  (open in https://ui.perfetto.dev)")
    _say(f"HTML report:  {report_path}")
    _say(f"done in {time.monotonic() - started:.0f} s")
    # The analyzer's exit code 1 means "found the problem": what the demo expects.
    return 0 if verdict == 1 else 1
