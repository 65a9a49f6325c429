"""Finding dumps and loading them: each file is read (dumpfile.py) and reduced (columnar.py for a compact
dump's columns, reduce.py for rows) as soon as it is read, in worker processes where there are many.
"""

from __future__ import annotations

import gc
import os
import re
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fr_backend import schema

from . import workers
from .columnar import Columns, read_dump, summarize_columns
from .dumpfile import (SafeUnpickler, UnsafePickleError, guard_address_space, load_dump, parse_compact, safe_loads,
                       shown)
from .fmt import rank_word, ranks_str
from .model import MALFORMED, DumpError, LoadProblem, LoadResult, RankConflict, RankPg, RankSummary, Sig
from .reduce import summarize_rows
from .trust import distrust_contradicted

__all__ = [
    "DumpError",
    "InputError",
    "SafeUnpickler",
    "UnsafePickleError",
    "discover",
    "discover_all",
    "guard_address_space",
    "load",
    "load_dump",
    "parse_compact",
    "safe_loads",
    "summarize",
]

_RANK_IN_NAME = re.compile(r"(\d+)(?:\.json\.gz|\.json|\.pkl|\.pickle|\.pt)?$")


class InputError(Exception):
    """The input as a whole cannot be analysed (exit code 2)."""



# --------------------------------------------------------------------------- discovery


@dataclass
class Candidate:
    rank_hint: int | None
    paths: list[str]  # tried in order; the first that loads wins


def _rank_from_name(name: str) -> int | None:
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def _is_incident(d: str) -> bool:
    return any(os.path.isdir(os.path.join(d, sub)) for sub in ("compact", "pickle", "json"))


def _skip_file(name: str) -> bool:
    return name.startswith(".") or name.endswith((".trace.json", ".html", ".md", ".txt", ".log"))


@dataclass
class Discovery:
    cands: list[Candidate]
    source: str
    notes: list[str]
    elsewhere: dict[int, str]  # rank without a file here -> a nearby incident folder that has one
    # older incident folders of the same dump directory within SIBLING_WINDOW_S, newest first, not read with it:
    # the one analysed may follow from one of them (aftermath.py)
    earlier: list[str] = field(default_factory=list)
    job: str | None = None  # the job whose incidents these are, where the folder names (or --job) say


def discover(paths: list[str], incident: str | None = None) -> tuple[list[Candidate], str]:
    """Turn the command-line PATHs into per-rank candidate files."""
    d = discover_all(paths, incident)
    return d.cands, d.source


# "-job.<tag>-" in an incident's name (newIncidentId): a reason never holds a dot, so nothing else reads as it
_JOB_IN_NAME = re.compile(r"-job\.([0-9a-f]{8})-")


def job_of(name: str) -> str:
    """The job tag an incident folder's name carries; "" for one of an older frnccl, which names none."""
    m = _JOB_IN_NAME.search(name)
    return m.group(1) if m else ""


def _one_job(root: str, names: list[str], job: str | None) -> tuple[list[str], str, list[str]]:
    """The incidents of one job: ``job``'s, else the newest incident's job's; with the note that says which
    other jobs' incidents were left out. Two jobs' dumps are never read as one job's (#45)."""
    if job is not None:
        # names of an older frnccl say no job: their dumps' headers may (load() reads only the job's)
        named = job if any(job_of(n) == job for n in names) else ""
        mine = [n for n in names if job_of(n) == named]
        if not mine:
            here = sorted({job_of(n) or "(none)" for n in names})
            raise InputError(f"{root}: no incident of job {job!r} (jobs here: {', '.join(here[:8])})")
    else:
        job = named = job_of(names[-1])
        mine = [n for n in names if job_of(n) == job]
    others: dict[str, list[str]] = {}
    for n in names:
        if job_of(n) != named:
            others.setdefault(job_of(n), []).append(n)
    if not others:
        return mine, job, []
    told = "; ".join(f"job {tag or '(none: an older frnccl)'}: {len(ns)} incident{'s' if len(ns) != 1 else ''}, "
                     f"newest {ns[-1]}" for tag, ns in sorted(others.items(), key=lambda kv: kv[1][-1], reverse=True)[:4])
    note = (f"read only job {job or '(none)'}'s incidents of {root}: the dumps of {len(others)} other "
            f"job{'s' if len(others) != 1 else ''} there were left out ({told}); --job TAG reads another")
    return mine, job, [note]


def discover_all(paths: list[str], incident: str | None = None, latest: str | None = None,
                 job: str | None = None) -> Discovery:
    """discover(), and for the latest incident of a dump directory (the latest at or before ``latest``, a folder
    name, if given) what its sibling incidents hold: per-rank incidents (each rank wrote its own, e.g. when the
    store was gone) are read together. Only one job's incidents: ``job``'s, else the latest incident's job's."""
    if (incident is None and len(paths) == 1 and os.path.isdir(paths[0]) and os.path.exists(paths[0])
            and not _is_incident(paths[0])):
        root = paths[0]
        names = [n for n in _incidents_in(root) if latest is None or n <= latest]
        if names:
            names, job, job_notes = _one_job(root, names, job)
            d = _with_siblings(root, names)
            d.notes[:0] = job_notes
            d.job = job
            me = _incident_time(names[-1])
            read = {os.path.normpath(os.path.dirname(os.path.dirname(c.paths[0]))) for c in d.cands if c.paths}
            d.earlier = [os.path.join(root, n) for n in reversed(names[:-1])
                         if me is not None and (t := _incident_time(n)) is not None
                         and me[0] - SIBLING_WINDOW_S <= t[0] <= me[0]
                         and os.path.normpath(os.path.join(root, n)) not in read]
            return d
    cands, source = _discover(paths, incident)
    return Discovery(cands, source, [], {}, job=job)


def _incidents_in(root: str) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(root) if e.is_dir() and _is_incident(e.path))
    except OSError as exc:
        raise InputError(f"{root}: cannot list ({exc.strerror})") from None


# "<UTC time>[.ms]-<reason>-r<rank>[-<n>][-local]" (HeartbeatMonitor's newIncidentId)
_INCIDENT_NAME = re.compile(r"^(\d{8}-\d{6})(?:\.(\d{3}))?-.*?-r(\d+)(?:-\d+)?(-local)?$")
SIBLING_WINDOW_S = 1800  # per-rank incidents of one event: within a group timeout (30 min) of each other


def _incident_time(name: str) -> tuple[float, int] | None:
    """(seconds since the epoch, rank in the name) of an incident folder name, or None."""
    import calendar
    import time as _time

    m = _INCIDENT_NAME.match(name)
    if not m:
        return None
    try:
        t = calendar.timegm(_time.strptime(m.group(1), "%Y%m%d-%H%M%S"))
    except ValueError:
        return None
    return t + int(m.group(2) or 0) / 1000, int(m.group(3))


def _with_siblings(root: str, names: list[str]) -> Discovery:
    """The latest incident; if it holds one rank's dumps only (a per-rank incident), the newest per-rank
    incident of each other rank from within SIBLING_WINDOW_S is read with it. Otherwise sibling incidents
    from that window holding ranks this one lacks are named in a note, with the command to read them all."""
    chosen = names[-1]
    inc = os.path.join(root, chosen)
    cands = _incident_candidates(inc)
    here = {c.rank_hint for c in cands}
    me = _incident_time(chosen)
    if me is None:
        return Discovery(cands, inc, [], {})
    per_rank = len(here) == 1 and here == {me[1]}
    parts: dict[int, tuple[str, list[Candidate]]] = {}  # rank -> (incident, its candidates), newest first
    for name in reversed(names[:-1]):
        t = _incident_time(name)
        if t is None or abs(t[0] - me[0]) > SIBLING_WINDOW_S:
            continue
        try:
            sub = _incident_candidates(os.path.join(root, name))
        except InputError:
            continue
        ranks = {c.rank_hint for c in sub if c.rank_hint is not None}
        if per_rank and not (ranks == {t[1]}):
            continue  # only per-rank incidents go with a per-rank incident
        for r in sorted(ranks - here):
            parts.setdefault(r, (name, [c for c in sub if c.rank_hint == r]))
    if not parts:
        return Discovery(cands, inc, [], {})
    used = sorted({name for name, _ in parts.values()})
    if per_rank:
        for _, sub in parts.values():
            cands.extend(sub)
        note = (f"{chosen} holds rank {me[1]} only: each rank wrote its own incident (the store was unreachable, "
                f"or the dumps were local), so the {len(used)} per-rank incident{'s' if len(used) != 1 else ''} of "
                f"{root} within {SIBLING_WINDOW_S // 60} min of it {'are' if len(used) != 1 else 'is'} read with it "
                f"({', '.join(used[:6])}{' ...' if len(used) > 6 else ''}); --incident ID reads one alone")
        return Discovery(cands, f"{inc} + {len(used)} sibling incident{'s' if len(used) != 1 else ''}", [note], {})
    elsewhere = {r: os.path.join(root, name) for r, (name, _) in parts.items()}
    note = (f"{rank_word(elsewhere)} {'has a dump' if len(elsewhere) == 1 else 'have dumps'} in other incidents of "
            f"{root} from within {SIBLING_WINDOW_S // 60} min ({', '.join(used[:6])}{' ...' if len(used) > 6 else ''}); "
            f"to analyse them together: frnccl analyze {inc} " + " ".join(os.path.join(root, n) for n in used[:6]))
    return Discovery(cands, inc, [note], elsewhere)


def _discover(paths: list[str], incident: str | None = None) -> tuple[list[Candidate], str]:
    if not paths:
        raise InputError("no input path given")
    for p in paths:
        if not os.path.exists(p):
            raise InputError(f"{p}: no such file or directory")
    if len(paths) == 1 and os.path.isdir(paths[0]):
        root = paths[0]
        if incident is not None:
            inc = os.path.join(root, incident)
            if not _is_incident(inc):
                if os.path.basename(os.path.normpath(root)) == incident and _is_incident(root):
                    inc = root
                else:
                    raise InputError(f"{root}: no incident named {incident!r}")
            return _incident_candidates(inc), inc
        if _is_incident(root):
            return _incident_candidates(root), root
        subdirs = _incidents_in(root)
        if subdirs:
            inc = os.path.join(root, subdirs[-1])
            return _incident_candidates(inc), inc
        files = sorted(e.path for e in os.scandir(root) if e.is_file() and not _skip_file(e.name))
        if not files:
            raise InputError(f"{root}: no dump files found")
        return [Candidate(_rank_from_name(os.path.basename(f)), [f]) for f in files], root
    cands: list[Candidate] = []
    for p in paths:
        if os.path.isdir(p):
            sub, _ = _discover([p], incident)
            cands.extend(sub)
        else:
            cands.append(Candidate(_rank_from_name(os.path.basename(p)), [p]))
    return cands, ", ".join(paths)


_DUMP_SUFFIXES = (".json.gz", ".json", ".pkl", ".pickle", ".pt")


def _stem(name: str) -> str:
    return next((name[:-len(x)] for x in _DUMP_SUFFIXES if name.endswith(x)), name)


def _incident_candidates(inc: str) -> list[Candidate]:
    """One candidate per dump: the same file name (less its format's suffix) in compact/, pickle/ and json/ is
    one dump in three formats, tried in that order. Two files of one rank in one folder are two dumps that
    claim the rank: two candidates, which load() reads both of and decides between (_decide_claims)."""
    by_rank: dict[int, list[tuple[str, set[str], list[str]]]] = {}  # rank -> (stem, folders, paths) per dump
    odd: list[Candidate] = []
    for sub in ("compact", "pickle", "json"):  # the first that loads wins: compact is the fastest to read
        folder = os.path.join(inc, sub)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if not os.path.isfile(path) or _skip_file(name):
                continue
            r = _rank_from_name(name) if name.startswith(schema.RANK_FILE_PREFIX) else None
            if r is None:
                odd.append(Candidate(_rank_from_name(name), [path]))
                continue
            dumps = by_rank.setdefault(r, [])
            same = next((d for d in dumps if d[0] == _stem(name) and sub not in d[1]), None)
            if same is None:
                dumps.append((_stem(name), {sub}, [path]))
            else:
                same[1].add(sub)
                same[2].append(path)
    if not by_rank and not odd:
        raise InputError(f"{inc}: no dump files in compact/, pickle/ or json/")
    return [Candidate(r, d[2]) for r in sorted(by_rank) for d in by_rank[r]] + odd


# --------------------------------------------------------------------------- driver

def summarize(d: dict[str, Any] | Columns, path: str, rank_hint: int | None) -> RankSummary:
    """Reduce what read_dump gave to the compact RankSummary (raises DumpError): a compact dump from its
    columns, any other from its rows."""
    if isinstance(d, dict):
        return summarize_rows(d, path, rank_hint)
    return summarize_columns(d, path, rank_hint)


def _load_path(path: str, rank_hint: int | None) -> tuple[RankSummary | None, LoadProblem | None]:
    """One file read and reduced: its summary, or the one-line problem that refused it."""
    try:
        d = read_dump(path)  # a compact dump stays columns: summarize reduces it without rows
        try:
            return summarize(d, path, rank_hint), None
        finally:
            del d  # the raw dict goes now, before the next file is read
    except DumpError as exc:
        return None, LoadProblem(path, str(exc))
    except MemoryError:  # past a reader worker's address-space bound (workers.FIRST_READ_FLOOR), while reducing it
        return None, LoadProblem(path, "refused: reading it takes more memory than a dump of its size can (a "
                                       "hostile or damaged file)")
    except MALFORMED as exc:
        return None, LoadProblem(path, f"malformed dump ({type(exc).__name__}: {str(exc)[:60]})")
    except Exception as exc:  # noqa: BLE001 - one file must never stop the analysis of the others
        return None, LoadProblem(path, f"could not be analysed (internal error {type(exc).__name__}: "
                                       f"{str(exc)[:60]})")


def _load_one(c: Candidate) -> tuple[RankSummary | None, list[LoadProblem]]:
    """The first of a candidate's paths that loads, and the problems of those tried before it."""
    problems: list[LoadProblem] = []
    for path in c.paths:
        summary, problem = _load_path(path, c.rank_hint)
        if summary is not None:
            return summary, problems
        if problem is not None:
            problems.append(problem)
    return None, problems


PARALLEL_MIN_FILES = 64


def _load_many(cands: list[Candidate], jobs: int, progress: Callable[[int, int], None] | None,
               isolate: bool = False) -> Iterator[tuple[RankSummary | None, list[LoadProblem]]]:
    """Each candidate's (summary, problems), in order. In worker processes (workers.py) when ``isolate``
    (the command line: a file can keep the C unpickler busy for hours, and only a process of its own can be
    stopped), whatever the input's size, or for a large input; otherwise in this process (a library call on
    a few files, e.g. inside a job, does not fork)."""
    if (isolate or (jobs > 1 and len(cands) >= PARALLEL_MIN_FILES)) and workers.available():
        outcomes: Iterable[tuple[RankSummary | None, list[LoadProblem]]] = workers.read_isolated(
            cands, max(1, jobs), _load_path)
    else:
        outcomes = map(_load_one, cands)
    for done, res in enumerate(outcomes, 1):
        if progress is not None:
            progress(done, len(cands))
        yield res


class Interner:
    """What ranks share is kept once: the global Sig table (equal Sigs from any rank get one id),
    the member tuples of PGs (the default PG's alone would be world_size**2 ints) and the strings
    of p2p records."""

    def __init__(self) -> None:
        self.sigs: list[Sig] = []
        self._ids: dict[Sig, int] = {}
        self._ranks: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._by_id: dict[int, tuple[int, ...]] = {}  # id of a long shared member tuple -> it
        self._strs: dict[str, str] = {}

    def adopt(self, s: RankSummary) -> None:
        """Re-point a rank's c_sig columns from its own table to the global one; share member tuples."""
        ids = self._ids
        remap = []
        for sig in s.sigs:
            i = ids.get(sig)
            if i is None:
                i = ids[sig] = len(self.sigs)
                self.sigs.append(sig)
            remap.append(i)
        identity = remap == list(range(len(remap)))
        strs = self._strs
        for rp in s.pgs.values():
            if not identity and len(rp.c_sig):
                rp.c_sig = array("i", map(remap.__getitem__, rp.c_sig))
            rp.sigs = self.sigs
            if self._by_id.get(id(rp.ranks)) is not rp.ranks:  # the shared tuple itself is not hashed again
                c = rp.ranks = self._ranks.setdefault(rp.ranks, rp.ranks)
                if len(c) > 16:
                    self._by_id[id(c)] = c  # holds it: its id is not reused
            if rp.p2ps:  # (seq, kind, peer, sizes, dtypes, state, ..., profiling_name): share the strings
                rp.p2ps = [(p[0], strs.setdefault(p[1], p[1]), p[2], strs.setdefault(p[3], p[3]),
                            strs.setdefault(p[4], p[4]), *p[5:10], strs.setdefault(p[10], p[10])) for p in rp.p2ps]
        s.sigs = self.sigs


def load(paths: list[str], incident: str | None = None,
         progress: Callable[[int, int], None] | None = None, jobs: int | None = None,
         isolate: bool = False, latest: str | None = None, job: str | None = None) -> LoadResult:
    """Discover, load and reduce every dump; one bad file never stops the rest.

    Each file is reduced to its compact summary as soon as it is read (in ``jobs`` worker
    processes for large inputs, and for any input with ``isolate``: each file under a CPU-time
    bound, see workers.py), so the raw dicts never pile up. Dumps of one job only: ``job``'s, else the job the
    folder names say, else the first job a dump names; a dump whose header names another is left out."""
    disc = discover_all(paths, incident, latest, job)
    want = disc.job or None  # "" (folders of an older frnccl) says nothing of the dumps inside
    left_out: dict[str, list[int]] = {}  # another job's tag -> the ranks of its dumps, not read
    found, source = disc.cands, disc.source
    cands = _ordered(found)
    if jobs is None:
        jobs = default_jobs()
    ranks: dict[int, RankSummary] = {}
    problems: list[LoadProblem] = []
    notes: list[str] = list(disc.notes)
    table = Interner()
    by_note: dict[str, list[int]] = {}  # a note of the dumps -> the ranks it is about
    claims: dict[int, list[RankSummary]] = {}  # rank -> every usable dump that claims it, the one loaded first
    was_enabled = gc.isenabled()
    gc.disable()  # millions of small containers: the cyclic GC would rescan them over and over
    try:
        for summary, probs in _load_many(cands, jobs, progress, isolate):
            problems.extend(probs)
            if summary is None:
                continue
            if summary.job_tag:
                want = want or summary.job_tag
                if summary.job_tag != want:
                    left_out.setdefault(summary.job_tag, []).append(summary.rank)
                    continue
            if summary.rank in ranks:
                claims.setdefault(summary.rank, [ranks[summary.rank]]).append(summary)
            else:
                table.adopt(summary)
                ranks[summary.rank] = summary
            if probs:
                notes.append(f"rank {summary.rank}: used {summary.path} instead")
    finally:
        if was_enabled:
            gc.enable()
    if left_out:
        notes.append(f"read only job {want}'s dumps: " + "; ".join(
            f"{rank_word(sorted(rs))} of job {tag} left out" for tag, rs in sorted(left_out.items())[:4])
            + " (two jobs' dumps are never read as one's; --job TAG reads another)")
    conflicts = [_decide_claims(r, claimed, ranks, table, set(claims)) for r, claimed in sorted(claims.items())]
    notes += [c.note for c in conflicts]
    for r, summary in sorted(ranks.items()):  # the dumps used, once claims are decided
        for n in summary.notes:
            by_note.setdefault(n, []).append(r)
    if not ranks and left_out:
        raise InputError(f"{source}: no dump of job {want} (the dumps here are of job "
                         f"{', '.join(sorted(left_out)[:4])}; --job TAG reads one)")
    if not ranks:
        what = "; ".join(f"{os.path.basename(p.path)}: {p.reason}" for p in problems[:3])
        raise InputError(f"{source}: no usable dump ({what})" if what else f"{source}: no usable dump")
    world = 0
    for s in ranks.values():
        world = max(world, s.world_size or 0, s.default_pg_size or 0, s.rank + 1)
        for rp in s.pgs.values():
            if rp.ranks:
                world = max(world, rp.ranks[-1] + 1)
    notes += [f"{rank_word(rs)}: {n}" for n, rs in by_note.items()]
    _resolve_members(ranks, world, notes)
    notes += distrust_contradicted(ranks)
    return LoadResult(ranks=dict(sorted(ranks.items())), problems=problems, source=source, world_size=world,
                      notes=notes, sigs=table.sigs,
                      elsewhere={r: p for r, p in disc.elsewhere.items() if r not in ranks},
                      conflicts=conflicts, earlier=list(disc.earlier), job_tag=want or "")


def _majority(values: Iterable[Any]) -> Any:
    """The value most of ``values`` have (None when there is none)."""
    counts: dict[Any, int] = {}
    for v in values:
        if v not in (None, ""):
            counts[v] = counts.get(v, 0) + 1
    return max(counts, key=counts.__getitem__) if counts else None


def _decide_claims(rank: int, claimed: list[RankSummary], ranks: dict[int, RankSummary], table: Interner,
                   contested: set[int]) -> RankConflict:
    """Two or more usable dumps claim ``rank``: the one the other ranks' dumps agree with (their incident,
    world size and format, and a host and pid no other rank's dump has) is used; when none or several do,
    none is (the rank's state is not known: better no name than a planted one). A name never decides, but a
    file whose name names another rank than its header contradicts itself and is not used; a rank that is
    ``contested`` itself counts for nothing."""
    others = [s for r, s in ranks.items() if r not in contested]
    want = {"incident": _majority(s.incident_id for s in others),
            "world size": _majority(s.world_size for s in others),
            "format": _majority(f"{s.fmt} {s.version}" for s in others)}
    taken = {(s.hostname, s.pid) for s in others if s.pid is not None}
    paths = [s.path for s in claimed]

    def why_not(s: RankSummary) -> str:
        named = _rank_from_name(os.path.basename(s.path))
        if named is not None and named != rank:  # a file contradicts itself: a name cannot win, but can lose
            return f"its name says rank {named}"
        got = {"incident": s.incident_id, "world size": s.world_size, "format": f"{s.fmt} {s.version}"}
        for what, v in want.items():
            if v is not None and got[what] != v:
                return f"{what} {shown(str(got[what]))}, not {shown(str(v))} as the other ranks' dumps"
        if s.pid is not None and (s.hostname, s.pid) in taken:
            return f"host {shown(s.hostname)} pid {s.pid} is another rank's"
        return ""

    first = claimed[0]
    same = all((s.incident_id, s.hostname, s.pid, s.dump_time_ns, s.n_entries) ==
               (first.incident_id, first.hostname, first.pid, first.dump_time_ns, first.n_entries) for s in claimed)
    names = ", ".join(map(_shown_path, paths))
    if same:
        return RankConflict(rank, paths, first.path,
                            f"rank {rank}: {len(claimed)} files hold the same dump ({names}); "
                            f"{_shown_path(first.path)} used")
    agree = [s for s in claimed if not why_not(s)]
    if len(agree) == 1:
        used = agree[0]
        if used is not first:
            ranks[rank] = used
            table.adopt(used)
        rejected = "; ".join(f"{_shown_path(s.path)}: {why_not(s)}" for s in claimed if s is not used)
        return RankConflict(rank, paths, used.path,
                            f"rank {rank}: {len(claimed)} usable files claim it ({names}); used "
                            f"{_shown_path(used.path)}, the one the other ranks' dumps agree with ({rejected})")
    del ranks[rank]
    how = ("each agrees with the other ranks' dumps" if agree else
           "none agrees with the other ranks' dumps (" + "; ".join(f"{_shown_path(s.path)}: {why_not(s)}"
                                                             for s in claimed) + ")")
    return RankConflict(rank, paths, None,
                        f"rank {rank}: {len(claimed)} usable files claim it ({names}) and {how}: which is its own "
                        f"cannot be told, so neither is used and rank {rank} is named by no finding")


def _shown_path(p: str) -> str:
    """A dump's path as a note gives it: its format folder and name."""
    return shown(os.path.join(os.path.basename(os.path.dirname(p)), os.path.basename(p)))


def _resolve_members(ranks: dict[int, RankSummary], world: int, notes: list[str]) -> None:
    """Groups whose members a dump does not give (torch's gloo pg_config): the default group is every rank
    of the job; another group is what the other dumps say of the same name, else the ranks that recorded
    ops in it (torch names groups the same on every member). Said in a note either way."""
    everyone = tuple(range(world))
    # name -> its member tuples, by id: every rank's summary holds the default group's (world_size long, one
    # shared tuple once loaded), and hashing it once a rank was world_size**2 steps (1 s at 16,384 ranks)
    known: dict[str, dict[int, tuple[int, ...]]] = {}
    unknown: dict[str, list[RankPg]] = {}
    whole: list[int] = []
    for r, s in sorted(ranks.items()):
        for rp in s.pgs.values():
            if rp.ranks:
                known.setdefault(rp.name, {})[id(rp.ranks)] = rp.ranks  # held by rp: its id is not reused
            elif rp.world_members:
                rp.ranks = everyone
                whole.append(r)
            else:
                unknown.setdefault(rp.name, []).append(rp)
    if whole:
        notes.append(f"{rank_word(whole)}: the dump does not say who is in the default group (torch's gloo writes "
                     f"every group's pg_config under the empty name); taken to be every rank seen (0-{world - 1})")
    for name, rps in unknown.items():
        mine = {id(x) for x in rps}  # held by rps: no id is reused meanwhile
        holders = sorted(r for r, s in ranks.items() if id(s.pgs.get(name)) in mine)
        got = set(known.get(name, {}).values())
        if len(got) == 1 and set(holders) <= set(next(iter(got))):
            members = next(iter(got))
            how = "as the other dumps give them"
        else:
            members = tuple(holders)
            how = ("taken to be the ranks that recorded it; a member that never issued an op in it cannot be "
                   "seen")
        for rp in rps:
            rp.ranks = members
        notes.append(f"pg {shown(name)}: {rank_word(holders)} do not say who is in it; members "
                     f"{ranks_str(members)}, {how}")


# What one loader worker may take at a time: the interpreter, one dump being read (a 20,000-entry pickle
# unfolds to ~150 MB of objects) and its summary. Workers are bounded by the memory free for them.
WORKER_BYTES = 512 << 20
# Past this many workers the main process, which unpickles and indexes every rank's columns (~0.3 ms a
# rank against ~5 ms a rank of reading), is what limits loading: more workers only take memory.
MAX_JOBS = 16


def default_jobs() -> int:
    """Loader workers when -j is not given: every usable core, as many as the free memory has room for
    (WORKER_BYTES each), at most MAX_JOBS."""
    jobs = min(_cores(), MAX_JOBS)
    avail = _available_bytes()
    if avail is not None:
        jobs = min(jobs, max(1, avail // WORKER_BYTES))
    return max(1, jobs)


def _available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux); None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cores() -> int:
    """Cores this process may run on (taskset and cpusets included)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _ordered(cands: Iterable[Candidate]) -> list[Candidate]:
    """Rank order, whatever the directory listing says."""
    return sorted(cands, key=lambda c: (c.rank_hint is None, c.rank_hint or 0, c.paths))
