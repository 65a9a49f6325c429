"""`frnccl analyze | trace | report` subcommands."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO

from .fmt import clean
from .load import InputError


def _job_tag(text: str) -> str:
    """--job's value: a job tag as dumps carry it (8 hex digits), given as is or within an incident's name."""
    from .header import JOB_TAG
    from .load import job_of

    tag = text if JOB_TAG.fullmatch(text) else job_of(text)
    if not tag:
        raise argparse.ArgumentTypeError(f"{clean(text[:80])!r} is not a job tag (8 hex digits, as in an incident's "
                                         "name: -job.TAG-)")
    return tag


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="dump directory (latest incident), incident directory, torch dump folder, or dump files")
    p.add_argument("--incident", metavar="ID", help="incident to read inside a dump directory")
    p.add_argument("--job", metavar="TAG", type=_job_tag,
                   help="job whose incidents to read, where a dump directory holds several jobs' (default: the "
                        "newest incident's job); the tag is in each incident's name, -job.TAG-")
    p.add_argument("--pg", metavar="NAME", help="only findings of this process group (name or description)")
    p.add_argument("-j", "--jobs", type=int, default=None, help="worker processes for loading (default: usable cores, at most 16 and 512 MiB of free memory each)")


def register(subparsers: Any) -> None:
    """Add the analyze, trace and report subcommands to an argparse subparsers object."""
    a = subparsers.add_parser("analyze", help="find the rank that broke a job from its flight-recorder dumps",
                              description="Analyse frnccl or torch flight-recorder dumps. Exit code: 0 no fault "
                                          "found (performance findings such as stragglers, and notes such as "
                                          "missing or truncated dumps, may still be printed), 1 a fault or "
                                          "suspect, 2 unusable input.")
    _common(a)
    a.add_argument("--json", action="store_true", help="print machine-readable JSON")
    a.add_argument("-v", "--verbose", action="store_true",
                   help="also print the hosts' clock offsets (always in --json; without -v only where they "
                        "change a finding)")
    a.set_defaults(func=cmd_analyze)
    t = subparsers.add_parser("trace", help="merge all ranks' dumps into one Chrome/Perfetto trace")
    _common(t)
    t.add_argument("-o", "--output", required=True, help="output .json file")
    t.set_defaults(func=cmd_trace)
    r = subparsers.add_parser("report", help="write a self-contained HTML report")
    _common(r)
    r.add_argument("-o", "--output", required=True, help="output .html file")
    r.set_defaults(func=cmd_report)


def _analysis(args: argparse.Namespace) -> Any:
    from .progress import make_progress
    from .report import run

    # isolate: every file is read in a worker process under a CPU-time bound (load.py, workers.py)
    return run(args.paths, args.incident, make_progress(), pg=args.pg, jobs=args.jobs, isolate=True, job=args.job)


def _say(text: str, stream: TextIO | None = None) -> None:
    """Write text that may hold what no encoding can take: file names with undecodable bytes
    (surrogate escapes) or lone surrogates from a JSON dump. Written as is when the stream can take
    it (a surrogate-escaped name comes back as its bytes), else with backslash escapes: never an
    UnicodeEncodeError, whatever PYTHONIOENCODING says."""
    s = stream if stream is not None else sys.stdout
    try:
        s.write(text)
    except UnicodeEncodeError:  # TextIOWrapper encodes the whole text before buffering: nothing was written
        enc = getattr(s, "encoding", None) or "utf-8"
        s.write(text.encode(enc, "backslashreplace").decode(enc, "replace"))


def _guard(fn: Any, args: argparse.Namespace) -> int:
    """Exit codes: what fn returns (0 nothing found, 1 findings), 2 for anything that went wrong, said
    in one line (dump-supplied text escaped); 1 must never mean a crash. A reader that went away (a closed
    pipe) leaves the verdict's code (fn returns it), or 1 when fn had none yet: never 0 unsaid."""
    from .load import guard_address_space

    guard_address_space()  # this process only analyzes: see guard_address_space
    try:
        return int(fn(args))
    except InputError as exc:
        _say(f"frnccl {args.command_name}: error: {clean(str(exc))}\n", sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away before fn could say its verdict: not "nothing found"
        _silence_stdout()
        return 1
    except OSError as exc:
        name = exc.filename if isinstance(exc.filename, str) else ""
        _say(f"frnccl {args.command_name}: error: {clean(name)}: {clean(str(exc.strerror or exc))}\n", sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug or an input no check foresaw: still one line, exit 2
        _say(f"frnccl {args.command_name}: internal error: {one_line(exc)}\n", sys.stderr)
        return 2


def _emit(text: str, code: int) -> int:
    """Write the output and return ``code``, the verdict's exit status, also when the reader (head, less)
    went away before the end: a closed pipe must not turn a hang into exit 0."""
    try:
        _say(text)
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
    return code


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null, so that what is still buffered is dropped at exit instead of failing there."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's stream): nothing flushes it at exit
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def one_line(exc: BaseException) -> str:
    """An exception as one escaped line: its type and the first line of its message, cut."""
    lines = str(exc).splitlines()
    msg = clean(lines[0][:200]) if lines else ""
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def cmd_analyze(args: argparse.Namespace) -> int:
    args.command_name = "analyze"
    return _guard(_analyze, args)


def _analyze(args: argparse.Namespace) -> int:
    from .report import exit_code, to_json, to_text

    a = _analysis(args)
    # JSON is ASCII: surrogates come out as \udcxx
    text = json.dumps(to_json(a), indent=1) + "\n" if args.json else to_text(a, clocks=args.verbose)
    return _emit(text, exit_code(a.findings))


def cmd_trace(args: argparse.Namespace) -> int:
    args.command_name = "trace"
    return _guard(_trace, args)


def _trace(args: argparse.Namespace) -> int:
    from .trace import write_trace

    a = _analysis(args)
    n = write_trace(a, args.output)
    return _emit(f"wrote {args.output}: {n} events from {len(a.res.ranks)} ranks\n", 0)


def cmd_report(args: argparse.Namespace) -> int:
    args.command_name = "report"
    return _guard(_report, args)


def _report(args: argparse.Namespace) -> int:
    from .html import write_html

    a = _analysis(args)
    write_html(a, args.output)
    return _emit(f"wrote {args.output}\n", 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="frnccl")
    sub = p.add_subparsers(dest="command", required=True)
    register(sub)
    if argv and argv[0] not in ("analyze", "trace", "report", "-h", "--help"):
        argv = ["analyze"] + argv  # python -m fr_backend.analyzer PATH ...
    args = p.parse_args(argv)
    return int(args.func(args))
