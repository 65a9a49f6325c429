"""`frnccl export --torch SRC OUT`: a folder of torch-readable pickles from any frnccl or torch dump.

torch's analyzer (``python -m torch.distributed.flight_recorder.fr_trace OUT``) reads a folder of
pickles named <prefix><rank>. frnccl writes the compact format by default, which fr_trace cannot
read; this command reads each rank's dump (compact, pickle or JSON, through ``load_dump``, with its
bounds and its refusal of pickles that reference code) and writes it as a plain pickle
``OUT/frnccl_rank_<R>``, the same dict frnccl's own pickle format holds.

OUT is created if missing; nothing in it is replaced and no link is followed: each file is created
with O_CREAT|O_EXCL|O_NOFOLLOW inside the folder opened with O_NOFOLLOW, and written complete or
removed. Exit code: 0 every rank exported, 1 some ranks' dumps could not be read (each said in one
line; the others are exported), 2 nothing usable (bad input, an existing file, no dump read).
"""

from __future__ import annotations

import argparse
import errno
import os
import pickle
import stat
import sys
from dataclasses import dataclass, field
from typing import Any

from . import members, schema
from .analyzer.fields import MAX_RANKS
from .analyzer.fmt import clean, ranks_str
from .analyzer.load import DumpError, InputError, discover, load_dump
from .analyzer.model import MALFORMED

PICKLE_PROTOCOL = 2  # what frnccl's C++ writer and torch's own dumps use
MAX_RANK = 1 << 31  # ranks are C ints in torch; a dump's claim past that is not a rank


class ExportError(Exception):
    """The export cannot go on (exit code 2); the message is one line."""


@dataclass
class Exported:
    written: dict[int, str] = field(default_factory=dict)  # rank -> file written
    skipped: list[str] = field(default_factory=list)  # one line per dump not read


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "export", help="write a copy of dumps in another format (--torch: pickles torch's fr_trace reads)",
        description="Write each rank's dump (compact, pickle or JSON, frnccl or torch) as a pickle "
                    "OUT/frnccl_rank_<R> that torch's `python -m torch.distributed.flight_recorder.fr_trace OUT` "
                    "reads. OUT is created if missing; no file in it is replaced. Exit code: 0 all ranks "
                    "exported, 1 some dumps unreadable (named; the rest exported), 2 unusable input.")
    p.add_argument("--torch", action="store_true", required=True,
                   help="torch's flight-recorder pickle format (the only export format)")
    p.add_argument("source", metavar="SRC", help="incident folder, dump folder (latest incident), or dump files' folder")
    p.add_argument("out", metavar="OUT", help="folder to write the pickles into (created if missing)")
    p.add_argument("--incident", metavar="ID", help="incident to read inside a dump folder")
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    try:
        result = export_torch(args.source, args.out, args.incident)
    except (ExportError, InputError) as exc:
        print(f"frnccl export: error: {clean(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        name = exc.filename if isinstance(exc.filename, str) else ""
        print(f"frnccl export: error: {clean(name)}: {clean(str(exc.strerror or exc))}", file=sys.stderr)
        return 2
    for line in result.skipped:
        print(f"frnccl export: skipped {clean(line)}", file=sys.stderr)
    if not result.written:
        print("frnccl export: error: no dump could be read", file=sys.stderr)
        return 2
    ranks = sorted(result.written)
    print(f"wrote {len(ranks)} torch pickle{'s' if len(ranks) != 1 else ''} to {clean(args.out)} "
          f"(ranks {_ranks(ranks)}); read them with: python -m torch.distributed.flight_recorder.fr_trace "
          f"{clean(args.out)}")
    return 1 if result.skipped else 0


def export_torch(source: str, out: str, incident: str | None = None) -> Exported:
    """Read every rank's dump under ``source`` and write ``out/frnccl_rank_<R>`` pickles.

    Each rank's pickle is written as soon as its dump is read, so memory holds one rank's dump whatever the
    job's size (a 16,384-rank incident of 5 MB pickles would be 80 GB held at once)."""
    cands, _ = discover([source], incident)
    result = Exported()
    dir_fd: int | None = None
    try:
        for cand in cands:
            problems = []
            for path in cand.paths:
                try:
                    d = _torch_form(load_dump(path))
                    # Here, not when writing: a value json.loads nests deeper than pickle can (RecursionError)
                    # is this rank's problem, not the export's.
                    data = pickle.dumps(d, protocol=PICKLE_PROTOCOL)
                except DumpError as exc:
                    problems.append(f"{path}: {exc}")
                    continue
                except MALFORMED as exc:  # a hostile rank's dump is skipped like a damaged one, never the export
                    problems.append(f"{path}: malformed dump ({type(exc).__name__}: {str(exc)[:60]})")
                    continue
                rank = d.get("rank")
                del d
                if type(rank) is not int or not 0 <= rank < MAX_RANK:
                    rank = cand.rank_hint
                if rank is None or not 0 <= rank < MAX_RANK:  # a 300-digit rank: a file name too long for OUT
                    problems.append(f"{path}: no rank in the dump or its name")
                    continue
                if rank in result.written:
                    problems.append(f"{path}: a second dump of rank {rank}")
                    continue
                if dir_fd is None:
                    dir_fd = _open_out_dir(out)
                    _refuse_existing(dir_fd, out, cands)
                name = f"{schema.RANK_FILE_PREFIX}{rank}"
                _write_new(dir_fd, out, name, data)
                result.written[rank] = os.path.join(out, name)
                break
            else:
                result.skipped.append(problems[-1] if problems else f"rank {cand.rank_hint}: no file")
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
    return result


def _refuse_existing(dir_fd: int, out: str, cands: list[Any]) -> None:
    """Before the first file is written: an export does not start over files of an earlier one (the name each
    rank's file will most likely have; a file that appears meanwhile still stops it, O_EXCL)."""
    for cand in cands:
        if cand.rank_hint is not None and 0 <= cand.rank_hint < MAX_RANK:
            name = f"{schema.RANK_FILE_PREFIX}{cand.rank_hint}"
            if _exists(name, dir_fd):
                raise ExportError(f"{os.path.join(out, name)} already exists; not replaced")


def _torch_form(d: dict[str, Any]) -> dict[str, Any]:
    """The row form as torch's own pickles hold it: process_group a (name, desc) tuple, each group's members
    torch's ranks string (frnccl dumps hold them once, as the members text)."""
    cfgs = d.get("pg_config")
    for cfg in cfgs.values() if isinstance(cfgs, dict) else ():
        if isinstance(cfg, dict) and type(cfg.get("members")) is str and "ranks" not in cfg:
            try:
                cfg["ranks"] = str(members.decode(cfg["members"], MAX_RANKS))
            except members.MembersError as exc:
                raise DumpError(f"pg_config members: {exc}") from None
    entries = d.get("entries")
    if entries is not None and type(entries) is not list:
        raise DumpError(f"entries is {type(entries).__name__}, not a list")
    for e in entries or ():
        pg = e.get("process_group") if isinstance(e, dict) else None
        if isinstance(pg, list):
            e["process_group"] = tuple(pg)
    return d


def _open_out_dir(out: str) -> int:
    # "link/" names the folder the link points to, even with O_NOFOLLOW: the last component must be the link.
    out = out.rstrip(os.sep) or os.sep
    try:
        os.mkdir(out, 0o750)
    except FileExistsError:
        pass
    try:
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ExportError(f"{out}: a symbolic link or not a folder; not written into") from None
        raise
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise ExportError(f"{out}: not a folder")
    return fd


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _write_new(dir_fd: int, out: str, name: str, data: bytes) -> None:
    path = os.path.join(out, name)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640, dir_fd=dir_fd)
    except FileExistsError:
        raise ExportError(f"{path} already exists; not replaced") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        os.unlink(name, dir_fd=dir_fd)  # never left half written
        raise


def _ranks(ranks: list[int]) -> str:
    return ranks_str(ranks)
