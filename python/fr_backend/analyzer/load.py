"""Finding and safely loading dumps, and reducing each one to a RankSummary.

Safety: pickles go through :class:`SafeUnpickler`, which builds plain types only
(dict, list, tuple, str, bytes, int, float, bool, None). Any pickle that names a
class or function (``GLOBAL``/``STACK_GLOBAL``, which is how ``os.system`` and
friends get in) is refused before anything is called. The one exception is the
``torch.jit._pickle.build_*list`` helpers that TorchScript's pickler may emit for
typed lists: they are mapped to our own ``list`` builder, never imported.
"""

from __future__ import annotations

import ast
import gc
import io
import json
import os
import pickle
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from fr_backend import schema

from .model import COMPLETED, SCHEDULED, Coll, LastOp, LoadProblem, LoadResult, P2P, RankPg, RankSummary
from .ops import family, is_marker, split_name

MAX_DUMP_BYTES = 4 << 30
_STATE = {"scheduled": SCHEDULED, "started": 1, "completed": COMPLETED}
_RANK_IN_NAME = re.compile(r"(\d+)(?:\.json|\.pkl|\.pickle|\.pt)?$")
_TORCH_LIST_BUILDERS = {"build_intlist", "build_doublelist", "build_boollist", "build_tensorlist", "build_strlist",
                        "build_list"}


class InputError(Exception):
    """The input as a whole cannot be analysed (exit code 2)."""


class DumpError(Exception):
    """One file is not a usable dump."""


class UnsafePickleError(DumpError, pickle.UnpicklingError):
    """A pickle tried to reference a class or function."""


def _build_list(items: Any) -> list[Any]:
    return list(items)


class SafeUnpickler(pickle.Unpickler):
    """Unpickler that refuses every global: only plain data can come out."""

    def find_class(self, module: str, name: str) -> Callable[..., Any]:
        if module == "torch.jit._pickle" and name in _TORCH_LIST_BUILDERS:
            return _build_list
        raise UnsafePickleError(f"refused to load {module}.{name}: dumps may contain plain data only")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("refused a persistent id: dumps may contain plain data only")


def safe_loads(data: bytes) -> Any:
    # BufferedReader gives the C unpickler peek(): it then reads in big chunks instead of
    # calling read() per opcode (protocol-2 pickles, as torch writes them, have no frames).
    return SafeUnpickler(io.BufferedReader(io.BytesIO(data), buffer_size=1 << 20)).load()


def load_dump(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load one dump file (pickle or JSON, frnccl or torch) safely; return the raw dict.

    Raises DumpError (with a one-line reason) for anything that is not a dump."""
    p = os.fspath(path)
    try:
        size = os.path.getsize(p)
        if size > MAX_DUMP_BYTES:
            raise DumpError(f"file too large ({size} bytes)")
        with open(p, "rb", buffering=0) as f:
            data = f.read()
    except OSError as exc:
        raise DumpError(f"cannot read: {exc.strerror or exc}") from None
    if not data:
        raise DumpError("empty file")
    head = data[:64].lstrip()
    if head[:1] in (b"{", b"["):
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise DumpError(f"corrupt or truncated JSON ({str(exc).splitlines()[0][:80]})") from None
    elif data[:1] == b"\x80" or data[:1] in (b"(", b"}", b"]"):
        try:
            obj = safe_loads(data)
        except UnsafePickleError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
                MemoryError, RecursionError, UnicodeDecodeError, OverflowError) as exc:
            msg = str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__
            raise DumpError(f"corrupt or truncated pickle ({msg})") from None
    else:
        raise DumpError("not a pickle or JSON file")
    if not isinstance(obj, dict):
        raise DumpError(f"not a flight-recorder dump (top level is {type(obj).__name__}, not dict)")
    if "entries" not in obj and "pg_config" not in obj:
        raise DumpError("not a flight-recorder dump (no entries or pg_config)")
    return obj


# --------------------------------------------------------------------------- discovery


@dataclass
class Candidate:
    rank_hint: int | None
    paths: list[str]  # tried in order; the first that loads wins


def _rank_from_name(name: str) -> int | None:
    m = _RANK_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def _is_incident(d: str) -> bool:
    return any(os.path.isdir(os.path.join(d, sub)) for sub in ("pickle", "json"))


def _skip_file(name: str) -> bool:
    return name.startswith(".") or name.endswith((".trace.json", ".html", ".md", ".txt", ".log"))


def discover(paths: list[str], incident: str | None = None) -> tuple[list[Candidate], str]:
    """Turn the command-line PATHs into per-rank candidate files."""
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
        try:
            subdirs = sorted(e.name for e in os.scandir(root) if e.is_dir() and _is_incident(e.path))
        except OSError as exc:
            raise InputError(f"{root}: cannot list ({exc.strerror})") from None
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
            sub, _ = discover([p], incident)
            cands.extend(sub)
        else:
            cands.append(Candidate(_rank_from_name(os.path.basename(p)), [p]))
    return cands, ", ".join(paths)


def _incident_candidates(inc: str) -> list[Candidate]:
    by_rank: dict[int, list[str]] = {}
    odd: list[Candidate] = []
    for sub in ("pickle", "json"):  # pickle first: preferred when both exist
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
            else:
                by_rank.setdefault(r, []).append(path)
    if not by_rank and not odd:
        raise InputError(f"{inc}: no dump files in pickle/ or json/")
    return [Candidate(r, by_rank[r]) for r in sorted(by_rank)] + odd


# --------------------------------------------------------------------------- reduction

_INTERN: dict[str, str] = {}


def _intern(s: str) -> str:
    return _INTERN.setdefault(s, s)


def _int(v: Any, default: int = 0) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _pg_ranks(cfg: dict[str, Any]) -> tuple[int, ...]:
    gr = cfg.get("global_ranks")
    if isinstance(gr, (list, tuple)):
        return tuple(sorted(int(r) for r in gr))
    rs = cfg.get("ranks")
    if isinstance(rs, str):
        try:
            val = ast.literal_eval(rs)
        except (ValueError, SyntaxError):
            return ()
        if isinstance(val, (list, tuple, set)):
            return tuple(sorted(int(r) for r in val))
        return ()
    if isinstance(rs, (list, tuple)):
        return tuple(sorted(int(r) for r in rs))
    return ()


def _frame(e: dict[str, Any]) -> str:
    frames = e.get("frames")
    if isinstance(frames, list) and frames and isinstance(frames[0], dict):
        f = frames[0]
        return f"{f.get('name', '?')} ({f.get('filename', '?')}:{f.get('line', '?')})"
    return ""


def summarize(d: dict[str, Any], path: str, rank_hint: int | None) -> RankSummary:
    """Reduce a raw dump dict to the compact RankSummary (raises DumpError)."""
    version = str(d.get("version", ""))
    major = version.split(".")[0]
    if major not in ("2", "3"):
        raise DumpError(f"unsupported dump version {version!r} (expected 2.x or 3.x)")
    fmt = "frnccl" if d.get("format") == schema.FORMAT_NAME else "torch"
    rank = d.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool):
        rank = rank_hint
    if rank is None or rank < 0:
        raise DumpError("cannot tell the rank (no 'rank' key and no digits at the end of the file name)")
    entries = d.get("entries", [])
    if not isinstance(entries, list):
        raise DumpError("'entries' is not a list")
    pg_config = d.get("pg_config") or {}
    pg_status = d.get("pg_status") or {}
    if not isinstance(pg_config, dict) or not isinstance(pg_status, dict):
        raise DumpError("'pg_config' or 'pg_status' is not a dict")
    clock = d.get("clock") if isinstance(d.get("clock"), dict) else {}
    offset = _int(clock.get("store_offset_ns", 0))
    stacks = d.get("thread_stacks", "")
    ws = d.get("world_size")
    s = RankSummary(
        rank=rank, path=path, fmt=fmt, version=version,
        world_size=ws if isinstance(ws, int) and ws > 0 else None,
        hostname=str(d.get("hostname", "")), pid=d.get("pid") if isinstance(d.get("pid"), int) else None,
        incident_id=str(d.get("incident_id", "")), dump_reason=str(d.get("dump_reason", "")),
        dump_detail=str(d.get("dump_detail", "")),
        trigger_rank=d.get("trigger_rank") if isinstance(d.get("trigger_rank"), int) else None,
        dump_time_ns=_int(d.get("dump_time_ns", 0)), thread_stacks=stacks if isinstance(stacks, str) else "",
        n_entries=len(entries), buffer_size=d.get("buffer_size") if isinstance(d.get("buffer_size"), int) else None,
    )

    # process groups: keyed by name; a gloo pg may have an empty name, then the dict key is used
    pgs: dict[str, RankPg] = {}
    by_desc: dict[str, str] = {}
    for key, cfg in pg_config.items():
        if not isinstance(cfg, dict):
            continue
        name = str(cfg.get("name") or key)
        desc = str(cfg.get("desc", ""))
        pgs[name] = RankPg(name=name, desc=desc, ranks=_pg_ranks(cfg))
        if str(key) != name:
            by_desc.setdefault(str(key), name)
        if desc:
            by_desc.setdefault(desc, name)
        if desc == "default_pg":
            s.default_pg_size = len(pgs[name].ranks)

    def pg_for(pg_name: str, pg_desc: str) -> RankPg:
        rp = pgs.get(pg_name)
        if rp is None:
            alias = by_desc.get(pg_name) or by_desc.get(pg_desc)
            rp = pgs.get(alias) if alias else None
        if rp is None:
            rp = pgs[pg_name] = RankPg(name=pg_name, desc=pg_desc, ranks=())
        return rp

    # entries: group per (pg, kind, seq) keeping order
    # pg -> seq -> entry (or list of entries when a coalesced group shares the seq)
    coll_groups: dict[str, dict[int, Any]] = {}
    p2p_groups: dict[str, dict[int, Any]] = {}
    pg_id_to_name: dict[str, str] = {}
    prev_p2p: dict[str, int] = {}  # pg -> p2p seq of the previous entry, when it was p2p
    first: dict[str, Any] | None = None
    last: dict[str, Any] | None = None
    pg_cache: dict[Any, RankPg] = {}
    for e in entries:
        try:
            pg_key = e["process_group"]
            prof = e["profiling_name"]
            rp = pg_cache.get(pg_key) if type(pg_key) is tuple else None
            if rp is None:
                rp = pg_for(str(pg_key[0]), str(pg_key[1]))
                if type(pg_key) is tuple:
                    pg_cache[pg_key] = rp
                if "pg_id" in e:
                    pg_id_to_name.setdefault(str(e["pg_id"]), rp.name)
        except (KeyError, IndexError, TypeError):
            raise DumpError("an entry lacks process_group or profiling_name") from None
        name = rp.name
        op, _, mark, _ = _opinfo(prof)
        p2p = e.get("is_p2p")
        if p2p is None:
            p2p = op in ("send", "recv") or (mark and prev_p2p.get(name) == _int(e.get("p2p_seq_id")))
            if p2p:
                prev_p2p[name] = _int(e.get("p2p_seq_id"))
            else:
                prev_p2p.pop(name, None)
        if p2p:
            seq = e.get("p2p_seq_id")
            groups = p2p_groups.get(name)
            if groups is None:
                groups = p2p_groups[name] = {}
        else:
            seq = e.get("collective_seq_id")
            groups = coll_groups.get(name)
            if groups is None:
                groups = coll_groups[name] = {}
        if type(seq) is not int:
            seq = _int(seq)
        g = groups.get(seq)
        if g is None:
            groups[seq] = e  # the common case: a lone op, no list
        elif type(g) is list:
            g.append(e)
        else:
            groups[seq] = [g, e]
        if first is None:
            first = e
        last = e

    # status
    for key, st in pg_status.items():
        if not isinstance(st, dict):
            continue
        name = st.get("process_group") or pg_id_to_name.get(str(key)) or (str(key) if str(key) in pgs else None)
        if name is None:
            continue
        rp = pg_for(str(name), "")
        rp.last_enqueued_coll = _int(st.get("last_enqueued_collective", 0))
        rp.last_completed_coll = _int(st.get("last_completed_collective", 0))
        rp.last_enqueued_p2p = _int(st.get("last_enqueued_p2p", 0))
        if "last_dropped_collective" in st:
            rp.dropped_coll = _int(st.get("last_dropped_collective"), -1)
        else:
            rp.dropped_coll = -2  # unknown: inferred below
        if "last_dropped_p2p" in st:
            rp.dropped_p2p = _int(st.get("last_dropped_p2p"), -1)
        else:
            rp.dropped_p2p = -2

    truncated = first is not None and _int(first.get("record_id"), 0) > 0
    for name, rp in pgs.items():
        cg = coll_groups.get(name, {})
        pgg = p2p_groups.get(name, {})
        if rp.dropped_coll == -2 or (rp.dropped_coll == -1 and fmt == "torch"):
            rp.dropped_coll = _infer_dropped(cg, rp.last_enqueued_coll, truncated, first)
        if rp.dropped_p2p == -2 or (rp.dropped_p2p == -1 and fmt == "torch"):
            rp.dropped_p2p = _infer_dropped(pgg, rp.last_enqueued_p2p, truncated, first)
        colls = rp.colls
        dropped = rp.dropped_coll
        intern = _INTERN.setdefault
        for seq, g in cg.items():
            if seq <= dropped:
                continue
            if type(g) is list:
                colls[seq] = _make_coll(seq, g, offset)
                continue
            op, _, _, fam = _OPINFO[g["profiling_name"]]
            if fam == "both":
                sk = f"{g.get('input_sizes')}>{g.get('output_sizes')}"
                dts = g.get("input_dtypes")
            elif fam == "none":
                sk, dts = "", None
            else:
                sk, dts = _keys(fam, g)
            if dts is None or type(dts) is str:
                dk = dts or ""
            else:
                dk = dts[0] if len(dts) == 1 else _dtkey(dts)
            sk = intern(sk, sk)
            created = g.get("time_created_ns") or 0
            t_c = created - offset if created else 0
            started = g.get("time_discovered_started_ns") or 0
            completed = g.get("time_discovered_completed_ns") or 0
            gpu = g.get("time_gpu_started_ns") or 0
            colls[seq] = (seq, op, op, sk, intern(dk, dk), _STATE.get(g.get("state"), SCHEDULED), t_c,
                          started - offset if started else 0, completed - offset if completed else 0,
                          gpu - offset if gpu else t_c, g.get("record_id", 0), 1, (op, sk, dk))
        if cg:
            rp.last_enqueued_coll = max(rp.last_enqueued_coll, max(cg))
        rp.last_enqueued_coll = max(rp.last_enqueued_coll, rp.dropped_coll)
        for seq, group in pgg.items():
            if seq <= rp.dropped_p2p:
                continue
            rp.p2ps.extend(_make_p2ps(seq, group if type(group) is list else [group], offset, rp.ranks))
        if pgg:
            rp.last_enqueued_p2p = max(rp.last_enqueued_p2p, max(pgg))
        rp.last_enqueued_p2p = max(rp.last_enqueued_p2p, rp.dropped_p2p)
    s.pgs = pgs
    if last is not None:
        op, _ = split_name(last["profiling_name"])
        name = pg_for(str(last["process_group"][0]), str(last["process_group"][1])).name
        seq = _int(last.get("p2p_seq_id") if last.get("is_p2p") else last.get("collective_seq_id"))
        s.last_op = LastOp(pg=name, name=str(last["profiling_name"]), seq=seq,
                           state=_STATE.get(str(last.get("state")), SCHEDULED), record_id=_int(last.get("record_id")),
                           frame=_frame(last))
    return s


def _infer_dropped(groups: dict[int, Any], last_enqueued: int, truncated: bool,
                   first: dict[str, Any] | None) -> int:
    """Torch dumps carry no last_dropped: history below the oldest seq kept is unknown; the oldest
    group of a cut buffer may have lost its first ops, so it counts as cut too."""
    if not groups:
        return last_enqueued if truncated or last_enqueued > 0 else -1
    lo = min(groups)
    g = groups[lo]
    if truncated and first is not None and any(e is first for e in (g if type(g) is list else [g])):
        return lo
    return lo - 1 if lo > 1 else -1


_OPINFO: dict[str, tuple[str, str, bool, str]] = {}


def _opinfo(prof: Any) -> tuple[str, str, bool, str]:
    """profiling_name -> (op, meta, is_marker, op_family), cached."""
    info = _OPINFO.get(prof)
    if info is None:
        op, meta = split_name(prof)
        info = _OPINFO[str(prof)] = (op, meta, is_marker(op), family(op))
    return info


def _dtkey(dts: Any) -> str:
    if isinstance(dts, list):
        if len(dts) == 1:
            return str(dts[0])
        return ",".join(sorted({str(x) for x in dts if x}))
    return str(dts) if dts else ""


def _keys(fam: str, e: dict[str, Any]) -> tuple[str, str]:
    if fam == "both":
        return f"{e.get('input_sizes')}>{e.get('output_sizes')}", _dtkey(e.get("input_dtypes"))
    if fam == "out":
        return f">{e.get('output_sizes')}", _dtkey(e.get("output_dtypes"))
    if fam == "in":
        return f"{e.get('input_sizes')}>", _dtkey(e.get("input_dtypes"))
    return "", ""


def _make_coll(seq: int, group: list[dict[str, Any]], offset: int) -> Coll:
    marker: dict[str, Any] | None = None
    ops: list[tuple[str, dict[str, Any]]] = []
    for e in group:
        op, _, mark, _ = _opinfo(e["profiling_name"])
        if mark:
            marker = e
        else:
            ops.append((op, e))
    names = [o for o, _ in ops]
    if marker is not None:
        mname = _opinfo(marker["profiling_name"])[0]
        display = f"{mname}[{','.join(names)}]" if names else mname
        names_key = ",".join(names) if names else mname
    else:
        display = f"coalesced[{','.join(names)}]"
        names_key = ",".join(names)
    keys = [_keys(family(o), e) for o, e in ops]
    sizes = "|".join(k[0] for k in keys)
    dtypes = "|".join(k[1] for k in keys)
    if marker is not None:
        state = _STATE.get(str(marker.get("state")), SCHEDULED)
        ref = marker
    else:  # group not closed yet: as far as the slowest op got
        state = min(_STATE.get(str(e.get("state")), SCHEDULED) for _, e in ops)
        ref = ops[-1][1]
    created = min(_int(e.get("time_created_ns")) for e in group)
    started = _int(ref.get("time_discovered_started_ns"))
    completed = _int(ref.get("time_discovered_completed_ns"))
    gpu = _int(ref.get("time_gpu_started_ns"))
    t_c = created - offset if created else 0
    nk, sk, dk = _intern(names_key), _intern(sizes), _intern(dtypes)
    return (seq, _intern(display), nk, sk, dk, state, t_c,
            started - offset if started else 0, completed - offset if completed else 0,
            gpu - offset if gpu else t_c, _int(ref.get("record_id")), max(1, len(ops)), (nk, sk, dk))


def _make_p2ps(seq: int, group: list[dict[str, Any]], offset: int, ranks: tuple[int, ...]) -> list[P2P]:
    marker = None
    for e in group:
        if _opinfo(e["profiling_name"])[2]:
            marker = e
    out: list[P2P] = []
    for e in group:
        op, meta, _, _ = _opinfo(e["profiling_name"])
        if op not in ("send", "recv"):
            continue
        peer = _int(e.get("peer", -1), -1)
        if peer < 0 and meta:
            peer = _peer_from_meta(op, meta, ranks)
        ref = marker if marker is not None else e
        started = _int(ref.get("time_discovered_started_ns"))
        completed = _int(ref.get("time_discovered_completed_ns"))
        created = _int(e.get("time_created_ns"))
        if op == "send":
            sizes, dts = e.get("input_sizes"), e.get("input_dtypes")
        else:
            sizes, dts = e.get("output_sizes"), e.get("output_dtypes")
        out.append((seq, op, peer, _intern(str(sizes)), _intern(_dtkey(dts)),
                    _STATE.get(str(ref.get("state")), SCHEDULED), created - offset if created else 0,
                    started - offset if started else 0, completed - offset if completed else 0,
                    _int(e.get("record_id")), _intern(str(e["profiling_name"]))))
    return out


def _peer_from_meta(op: str, meta: str, ranks: tuple[int, ...]) -> int:
    """'0->1' (send) or '1<-0' (recv) hold group-local ranks; map the peer to a global rank."""
    try:
        if op == "send":
            local = int(meta.split("->")[1])
        else:
            local = int(meta.split("<-")[1])
    except (IndexError, ValueError):
        return -1
    if ranks and 0 <= local < len(ranks):
        return ranks[local]
    return local if not ranks else -1


# --------------------------------------------------------------------------- driver


def _load_one(c: Candidate) -> tuple[RankSummary | None, list[LoadProblem]]:
    problems: list[LoadProblem] = []
    for path in c.paths:
        try:
            d = load_dump(path)
            return summarize(d, path, c.rank_hint), problems
        except DumpError as exc:
            problems.append(LoadProblem(path, str(exc)))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            problems.append(LoadProblem(path, f"malformed dump ({type(exc).__name__}: {str(exc)[:60]})"))
    return None, problems


def _load_many(cands: list[Candidate], jobs: int,
               progress: Callable[[int, int], None] | None) -> Iterable[tuple[RankSummary | None, list[LoadProblem]]]:
    if jobs > 1 and len(cands) >= PARALLEL_MIN_FILES:
        import multiprocessing as mp

        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        with ctx.Pool(jobs, initializer=gc.disable) as pool:
            for i, res in enumerate(pool.imap(_load_one, cands, chunksize=4)):
                if progress is not None:
                    progress(i + 1, len(cands))
                yield res
        return
    for i, c in enumerate(cands):
        res = _load_one(c)
        if progress is not None:
            progress(i + 1, len(cands))
        yield res


PARALLEL_MIN_FILES = 64


def load(paths: list[str], incident: str | None = None,
         progress: Callable[[int, int], None] | None = None, jobs: int | None = None) -> LoadResult:
    """Discover, load and reduce every dump; one bad file never stops the rest.

    Each file is reduced to its compact summary as soon as it is read (in ``jobs`` worker
    processes for large inputs), so the raw dicts never pile up."""
    found, source = discover(paths, incident)
    cands = _ordered(found)
    if jobs is None:
        jobs = min(4, os.cpu_count() or 1)
    ranks: dict[int, RankSummary] = {}
    problems: list[LoadProblem] = []
    notes: list[str] = []
    was_enabled = gc.isenabled()
    gc.disable()  # millions of small containers: the cyclic GC would rescan them over and over
    try:
        for summary, probs in _load_many(cands, jobs, progress):
            problems.extend(probs)
            if summary is None:
                continue
            if summary.rank in ranks:
                notes.append(f"{summary.path}: rank {summary.rank} already loaded from {ranks[summary.rank].path}; "
                             "ignored")
            else:
                ranks[summary.rank] = summary
            if probs:
                notes.append(f"rank {summary.rank}: used {summary.path} instead")
    finally:
        if was_enabled:
            gc.enable()
    if not ranks:
        what = "; ".join(f"{os.path.basename(p.path)}: {p.reason}" for p in problems[:3])
        raise InputError(f"{source}: no usable dump ({what})" if what else f"{source}: no usable dump")
    world = 0
    for s in ranks.values():
        world = max(world, s.world_size or 0, s.default_pg_size or 0, s.rank + 1)
        for rp in s.pgs.values():
            if rp.ranks:
                world = max(world, rp.ranks[-1] + 1)
    return LoadResult(ranks=dict(sorted(ranks.items())), problems=problems, source=source, world_size=world,
                      notes=notes)


def _ordered(cands: Iterable[Candidate]) -> list[Candidate]:
    """Rank order, whatever the directory listing says."""
    return sorted(cands, key=lambda c: (c.rank_hint is None, c.rank_hint or 0, c.paths))
