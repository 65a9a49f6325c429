"""Reduce one raw dump dict to its compact :class:`RankSummary`, as soon as it is read.

What survives is what the analysis needs: per PG and per seq a signature id (op names, sizes and
dtypes, shared by every op that looked the same), the state and a few times, as columns; stack
frames, thread names and every other field go away with the raw dict.

The usual shape of a dump (every entry a dict with the usual keys, seqs ascending and contiguous
per PG) is reduced column-wise in C (``itemgetter``, ``array``); signatures are computed once
per run of identical ops. Anything else (coalesced groups sharing a seq, missing keys, odd
types, torch dumps without ``is_p2p``) takes a slower, tolerant path with the same result.
"""

from __future__ import annotations

import ast
import json
import marshal
import re
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from itertools import chain, compress, pairwise, repeat
from operator import and_, eq, is_, itemgetter, ne, not_
from typing import Any

from fr_backend import schema

from .model import (
    COMPLETED,
    P2P,
    SCHEDULED,
    STARTED,
    DumpError,
    LastOp,
    RankPg,
    RankSummary,
    Sig,
)
from .ops import family, is_marker, split_name

_STATE = {"scheduled": SCHEDULED, "started": STARTED, "completed": COMPLETED}
_FRAMES_KEPT = 16  # callers of a rank's newest entries, kept for the evidence of findings
# Ranks at or above this are taken for corruption: the world size bounds loops and lists of ranks.
MAX_RANKS = 1 << 20
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_SIG_KEYS = ("profiling_name", "input_sizes", "output_sizes", "input_dtypes", "output_dtypes")
_GET_PG = itemgetter("process_group")
_GET_PROF = itemgetter("profiling_name")
_BAD_ENTRY = "an entry lacks process_group or profiling_name"

# Per process (each loader worker has its own): op name -> info, the marshalled raw
# (profiling_name, sizes, dtypes) of an op -> its Sig, interned strings. Bounded, in case of
# hostile input.
_OPINFO: dict[str, tuple[str, str, bool, str]] = {}
_SIG_CACHE: dict[bytes, Sig] = {}
_STRINGS: dict[str, str] = {}
_CACHE_MAX = 1 << 16


def summarize(d: Any, path: str, rank_hint: int | None) -> RankSummary:
    """Reduce a raw dump dict to the compact RankSummary (raises DumpError). A compact dump read
    by columnar.read_dump is reduced from its columns (the same summary, without rows)."""
    if not isinstance(d, dict):
        from .columnar import summarize_columns

        return summarize_columns(d, path, rank_hint)
    entries = d.get("entries", [])
    h = Header(d, path, rank_hint, len(entries) if isinstance(entries, list) else 0,
               entries_ok=isinstance(entries, list))
    s, pgs = h.s, h.pgs

    # entries, per PG (entry order kept)
    per_pg: dict[str, list[dict[str, Any]]] = {}
    pg_id_to_name: dict[str, str] = {}
    last_rp: RankPg | None = None
    if entries:
        try:
            pgcol = list(map(_GET_PG, entries))  # also proves every entry is a dict
            deque(map(_GET_PROF, entries), maxlen=0)
        except (KeyError, TypeError):
            raise DumpError(_BAD_ENTRY) from None
        by_key = _group(pgcol)
        merged: dict[str, list[int]] = {}
        for k, ix in by_key.items():  # first-appearance order
            try:
                rp = h.pg_for(str(k[0]), str(k[1]))
            except (IndexError, TypeError, KeyError):
                raise DumpError(_BAD_ENTRY) from None
            e0 = entries[ix[0]]
            if "pg_id" in e0:
                pg_id_to_name.setdefault(str(e0["pg_id"]), rp.name)
            if ix[-1] == len(entries) - 1:
                last_rp = rp
            got = merged.get(rp.name)
            merged[rp.name] = ix if got is None else sorted(got + ix)
        for name, ix in merged.items():
            per_pg[name] = entries if len(ix) == len(entries) else [entries[i] for i in ix]

    with_status = h.status(pg_id_to_name)
    first = entries[0] if entries else None
    truncated = first is not None and _int(first.get("record_id"), 0) > 0
    sig_ids: dict[Sig, int] = {}
    for name, rp in pgs.items():
        ents = per_pg.get(name, [])
        cols = _cols(ents, _ROW_KEYS)
        flags = cols[0]
        if ents and (None in flags or any(flags)):  # p2p ops in this PG (or torch dumps without is_p2p)
            colls, p2ps = _split_p2p(ents, flags)
            cols = _cols(colls, _ROW_KEYS)
        else:
            colls, p2ps = ents, []
        _coll_columns(rp, colls, cols, first, truncated, h.fmt, h.offset, sig_ids)
        _p2p_ops(rp, p2ps, first, truncated, h.fmt, h.offset)
        _failed(s, rp, cols, h.fmt, name in with_status)
    h.finish(entries[-_FRAMES_KEPT:], last_rp)
    return s


class Header:
    """What a summary takes from a dump besides its entries (header, pg_config, pg_status), and the
    steps both readers of entries (rows here, columns in columnar.py) share."""

    def __init__(self, d: dict[str, Any], path: str, rank_hint: int | None, n_entries: int,
                 entries_ok: bool = True) -> None:
        version = str(d.get("version", ""))
        if version.split(".")[0] not in ("2", "3"):
            raise DumpError(f"unsupported dump version {version[:40]!r} (expected 2.x or 3.x)")
        fmt = "frnccl" if d.get("format") == schema.FORMAT_NAME else "torch"
        rank = d.get("rank")
        if type(rank) is not int:
            rank = rank_hint
        if rank is None or rank < 0:
            raise DumpError("cannot tell the rank (no 'rank' key and no digits at the end of the file name)")
        if rank >= MAX_RANKS:
            raise DumpError(f"implausible rank {str(rank)[:24]} (more than {MAX_RANKS} ranks)")
        if not entries_ok:
            raise DumpError("'entries' is not a list")
        pg_config = d.get("pg_config") or {}
        pg_status = d.get("pg_status") or {}
        if not isinstance(pg_config, dict) or not isinstance(pg_status, dict):
            raise DumpError("'pg_config' or 'pg_status' is not a dict")
        clock = d.get("clock")
        # Older dumps carry clock.store_offset_ns (always written as 0; the key is gone): honoured when set.
        offset = _i64(clock.get("store_offset_ns", 0)) if isinstance(clock, dict) else 0
        stacks = d.get("thread_stacks", "")
        ws, pid, trig, bs = d.get("world_size"), d.get("pid"), d.get("trigger_rank"), d.get("buffer_size")
        s = RankSummary(
            rank=rank, path=path, fmt=fmt, version=version,
            world_size=ws if type(ws) is int and 0 < ws <= MAX_RANKS else None,
            hostname=str(d.get("hostname", "")), pid=pid if type(pid) is int else None,
            incident_id=str(d.get("incident_id", "")), dump_reason=str(d.get("dump_reason", "")),
            dump_detail=str(d.get("dump_detail", "")), trigger_rank=trig if type(trig) is int else None,
            dump_time_ns=_ns(d.get("dump_time_ns"), offset),  # on the entries' clock
            thread_stacks=stacks if isinstance(stacks, str) else "",
            n_entries=n_entries, buffer_size=bs if type(bs) is int else None,
        )
        self.s, self.fmt, self.offset, self.pg_status = s, fmt, offset, pg_status

        # process groups: keyed by name; a gloo pg may have an empty name, then the dict key is used
        pgs: dict[str, RankPg] = {}
        by_desc: dict[str, str] = {}
        anon: dict[str, Any] | None = None
        for key, cfg in pg_config.items():
            if not isinstance(cfg, dict):
                continue
            name = str(cfg.get("name") or key)
            if not name:  # torch's gloo registers every group under '': the last one created overwrote the others
                anon = cfg
                continue
            desc = str(cfg.get("desc", ""))
            pgs[name] = RankPg(name=name, desc=desc, ranks=_pg_ranks(cfg), sigs=s.sigs)
            if str(key) != name:
                by_desc.setdefault(str(key), name)
            if desc:
                by_desc.setdefault(desc, name)
            if desc == "default_pg":
                s.default_pg_size = len(pgs[name].ranks)
        self.pgs, self.by_desc, self.anon = pgs, by_desc, anon

    def pg_for(self, pg_name: str, pg_desc: str) -> RankPg:
        pgs = self.pgs
        rp = pgs.get(pg_name)
        if rp is None:
            alias = self.by_desc.get(pg_name) or self.by_desc.get(pg_desc)
            rp = pgs.get(alias) if alias else None
        if rp is None:
            rp = pgs[pg_name] = RankPg(name=pg_name, desc=pg_desc, ranks=(), sigs=self.s.sigs)
        return rp

    def status(self, pg_id_to_name: dict[str, str]) -> set[str]:
        """Apply pg_status (after the entries named their groups); the names of the groups that have one."""
        s, pgs, pg_status = self.s, self.pgs, self.pg_status
        if self.anon is not None:
            _adopt_anonymous_config(s, pgs, self.anon, pg_status)
        for rp in pgs.values():
            if not rp.ranks and rp.desc == "default_pg":
                rp.world_members = True

        # status: frnccl names the group; torch keys it by the process-local id that the entries carry as pg_id
        with_status: set[str] = set()
        for key, name in _status_names(s, pg_status, pg_id_to_name, pgs).items():
            st = pg_status[key]
            rp = self.pg_for(str(name), "")
            with_status.add(rp.name)
            rp.last_enqueued_coll = _int(st.get("last_enqueued_collective", 0))
            rp.last_completed_coll = _int(st.get("last_completed_collective", 0))
            rp.last_enqueued_p2p = _int(st.get("last_enqueued_p2p", 0))
            rp.dropped_coll = _int(st.get("last_dropped_collective"), -1) if "last_dropped_collective" in st else -2
            rp.dropped_p2p = _int(st.get("last_dropped_p2p"), -1) if "last_dropped_p2p" in st else -2  # -2: infer
        return with_status

    def finish(self, newest: list[dict[str, Any]], last_rp: RankPg | None) -> None:
        """The last op and the callers of the newest entries (``newest``: the last _FRAMES_KEPT entries as rows)."""
        s, pgs = self.s, self.pgs
        if newest:
            last = newest[-1]
            assert last_rp is not None
            lp = last.get("is_p2p")
            seq = _int(last.get("p2p_seq_id") if lp else last.get("collective_seq_id"))
            state = _state(last.get("state"))
            if last_rp.untrusted_states and not lp and (i := last_rp.slot(seq)) >= 0:
                state = last_rp.c_state[i]  # as corrected from pg_status
            # entries share their frames list when they were called from the same place (a compact dump's table)
            known: dict[int, tuple[Any, str]] = {}

            def frame(e: dict[str, Any]) -> str:
                fr = e.get("frames")
                got = known.get(id(fr))
                if got is None or got[0] is not fr:
                    got = known[id(fr)] = (fr, _frame(e))
                return got[1]

            s.last_op = LastOp(pg=last_rp.name, name=str(last["profiling_name"]), seq=seq, state=state,
                               record_id=_int(last.get("record_id")), frame=frame(last))
            for e in newest:
                if not e.get("is_p2p") and (f := frame(e)):
                    pg = e["process_group"]
                    name = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(pg)
                    s.frames[(name if name in pgs else self.by_desc.get(name, name),
                              _int(e.get("collective_seq_id")))] = f
        s.pgs = pgs
        for rp in pgs.values():
            _share_equal_columns(rp)


def _failed(s: RankSummary, rp: RankPg, cols: list[Sequence[Any]], fmt: str, has_status: bool) -> None:
    """Ops retired without completing (frnccl: failed), or torch's gloo's states that are never updated."""
    retired, states = cols[8], cols[2]
    if True in retired and states.count("completed") != len(states):
        if fmt == "frnccl":  # frnccl keeps states: retired and not completed is an op that failed
            # (the few such entries picked out in C first: a dump's last op is often still running)
            cand = compress(cols[1], map(and_, map(is_, retired, repeat(True)), map(ne, states, repeat("completed"))))
            rp.failed.update(_int(q) for q in cand if _int(q) > rp.dropped_coll)
        elif any(r is True and x == "scheduled" for r, x in zip(retired, states)):
            _untrusted_states(s, rp, has_status)


def _share_equal_columns(rp: RankPg) -> None:
    """Columns with equal values become one object (GPU start = discovered start, or end = completion, as
    often): a rank's summary is a third smaller in memory and in the pickle from a loader worker. Nothing
    writes to the columns after reduction."""
    for a in ("c_arrive", "c_end"):
        col = getattr(rp, a)
        for b in ("c_started", "c_completed", "c_created"):
            other = getattr(rp, b)
            if col is not other and col == other:
                setattr(rp, a, other)
                break


def _adopt_anonymous_config(s: RankSummary, pgs: dict[str, RankPg], cfg: dict[str, Any],
                            pg_status: dict[Any, Any]) -> None:
    """torch's gloo writes pg_config {'': {'name': '', ...}}: every group registered under the empty
    name, the last one created winning. It describes a group only when the process has one group (one
    pg_status key, one group in the entries); else its members are not in the dump."""
    members = _pg_ranks(cfg)
    if members and len(pgs) == 1 and len(pg_status) <= 1:
        rp = next(iter(pgs.values()))
        if not rp.ranks:
            rp.ranks = members
            if rp.desc == "default_pg":
                s.default_pg_size = len(members)
            return


def _status_names(s: RankSummary, pg_status: dict[Any, Any], by_id: dict[str, str],
                  pgs: dict[str, RankPg]) -> dict[Any, str]:
    """pg_status key -> group name. frnccl writes the name in the status; torch keys it by the process-local
    id of the group (creation order in this process), which the entries carry as pg_id. A key no entry
    names (the group's ops all left the ring buffer) is matched to the one group left over, or, when
    the groups left over have torch's default names (a counter over the job's creation order), in order
    of creation; otherwise it is left out and a note says so, rather than guessing."""
    out: dict[Any, str] = {}
    rest: list[Any] = []
    for key, st in pg_status.items():
        if not isinstance(st, dict):
            continue
        name = st.get("process_group")
        if name:
            out[key] = str(name)
        elif str(key) in by_id:
            out[key] = by_id[str(key)]
        else:
            rest.append(key)
    if not rest:
        return out
    left = [n for n in pgs if n not in set(out.values())]
    if len(rest) == 1 and len(left) == 1:
        out[rest[0]] = left[0]
        return out
    keys = [str(k) for k in rest]
    if (len(rest) == len(left) and all(k.isdigit() for k in keys) and all(n.isdigit() for n in left)
            and all(str(k).isdigit() and v.isdigit() for k, v in out.items())):
        pairs = list(zip(sorted(rest, key=lambda k: int(k)), sorted(left, key=int)))
        order = sorted([(int(k), int(v)) for k, v in out.items()] + [(int(k), int(v)) for k, v in pairs])
        if all(a[1] < b[1] for a, b in pairwise(order)):  # ids and names grow together: creation order
            out.update(pairs)
            return out
    s.notes.append(f"pg_status keys {', '.join(_shown(k) for k in keys[:8])} could not be matched to a group "
                   "(torch keys them by a process-local id that no entry names): their counters are not used")
    return out


def _shown(k: Any) -> str:
    t = str(k)
    return repr(t if len(t) <= 20 else t[:20] + "...")


def _untrusted_states(s: RankSummary, rp: RankPg, has_status: bool) -> None:
    """Entries retired (finished) but still 'scheduled': torch's gloo never updates the state. Ops at or
    below pg_status last_completed_collective are taken as completed; started vs scheduled is unknown."""
    rp.untrusted_states = True
    if has_status and rp.last_completed_coll > 0 and len(rp.c_seq):
        last = rp.last_completed_coll
        rp.c_state = bytes(COMPLETED if q <= last else x for q, x in zip(rp.c_seq, rp.c_state))
        s.notes.append("entries say 'scheduled' although retired (torch's gloo does not update the state): "
                       "ops up to pg_status last_completed_collective are taken as completed, the others' "
                       "state is unknown")
    else:
        s.notes.append(f"entries of pg {_shown(rp.name)} say 'scheduled' although retired (torch's gloo does not "
                       "update the state), and no pg_status says which completed: their state is unknown")


def _group(keys: list[Any]) -> dict[Any, list[int]]:
    """key -> indices where it occurs, in first-appearance order."""
    try:
        distinct = list(dict.fromkeys(keys))
    except TypeError:  # unhashable keys: JSON gives lists
        keys = [_hashable(k) for k in keys]
        distinct = list(dict.fromkeys(keys))
    n = len(keys)
    if len(distinct) == 1:
        return {distinct[0]: list(range(n))}
    if len(distinct) <= 8:  # a few PGs per rank: one C-level scan per key
        return {k: list(compress(range(n), map(eq, keys, repeat(k)))) for k in distinct}
    by_key: dict[Any, list[int]] = {k: [] for k in distinct}
    for i, k in enumerate(keys):
        by_key[k].append(i)
    return by_key


# --------------------------------------------------------------------------- collectives


def _split_p2p(ents: list[dict[str, Any]], flags: Sequence[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(collectives, p2p ops), entry order kept. Torch dumps without ``is_p2p``: send/recv, and a
    coalesced marker closing p2p ops of the same p2p seq, are p2p."""
    if None not in flags:
        return [e for e, p in zip(ents, flags) if not p], [e for e, p in zip(ents, flags) if p]
    colls: list[dict[str, Any]] = []
    p2ps: list[dict[str, Any]] = []
    prev: int | None = None  # p2p seq of the previous entry, when it was (inferred) p2p
    for e, p in zip(ents, flags):
        if p is None:
            op, _, mark, _ = _opinfo(e["profiling_name"])
            pseq = _int(e.get("p2p_seq_id"))
            p = op in ("send", "recv") or (mark and prev == pseq)
            prev = pseq if p else None
        (p2ps if p else colls).append(e)
    return colls, p2ps


def _contiguous(seqs: Sequence[Any]) -> bool:
    """Ascending, contiguous, one entry per seq: the usual shape, reduced column-wise."""
    n = len(seqs)
    return (n > 0 and type(seqs[0]) is int and type(seqs[-1]) is int and seqs[-1] - seqs[0] == n - 1
            and tuple(seqs) == tuple(range(seqs[0], seqs[0] + n)))


def _coll_columns(rp: RankPg, ents: list[dict[str, Any]], cols: list[Sequence[Any]], first: dict[str, Any] | None,
                  truncated: bool, fmt: str, offset: int, sig_ids: dict[Sig, int],
                  sig_column: Callable[[int], array] | None = None) -> None:
    """Fill rp's collective columns from its collective entries (``cols``: their _ROW_KEYS columns).
    columnar.py passes no rows: ``ents`` then only says whether the first is ``first``, and
    ``sig_column(start)`` gives the signature ids of the entries from ``start`` on (contiguous seqs only)."""
    _, seqs, states, created, started, completed, gpu, record, _, gpu_end = cols[:10]
    n = len(seqs)
    fast = _contiguous(seqs)
    if fast:
        lo, hi = seqs[0], seqs[-1]
        first_in_lo = ents[0] is first
    else:
        groups: dict[int, list[dict[str, Any]]] = {}
        for e, q in zip(ents, seqs):
            groups.setdefault(q if type(q) is int else _int(q), []).append(e)
        lo = min(groups) if groups else 0
        hi = max(groups) if groups else 0
        first_in_lo = bool(groups) and any(e is first for e in groups[lo])
    if rp.dropped_coll == -2 or (rp.dropped_coll == -1 and fmt == "torch"):
        rp.dropped_coll = _infer_dropped(lo if n else None, first_in_lo, rp.last_enqueued_coll, truncated)
    dropped = rp.dropped_coll
    if n:
        rp.last_enqueued_coll = max(rp.last_enqueued_coll, hi)
    rp.last_enqueued_coll = max(rp.last_enqueued_coll, dropped)
    if not n:
        return
    if fast:
        start = max(0, dropped + 1 - lo)
        if start:
            if start >= n:
                return
            ents = ents[start:]
            states, created, started, completed, gpu, record = (c[start:] for c in cols[2:8])
            gpu_end = gpu_end[start:]
        rp.c_seq = array("q", range(lo + start, hi + 1))
        rp.c_sig = sig_column(start) if sig_column is not None else _sig_column(ents, sig_ids, rp.sigs)
        rp.c_state = _states(states)
        created = rp.c_created = _times(created, offset)
        rp.c_started = _times(started, offset)
        rp.c_completed = _times(completed, offset)
        gpu_end = _times(gpu_end, offset)
        if not any(gpu_end):
            rp.c_end = rp.c_completed
        elif 0 not in gpu_end:
            rp.c_end = gpu_end
        else:
            rp.c_end = _or_else(gpu_end, rp.c_completed)
        gpu = _times(gpu, offset)
        if not any(gpu):
            rp.c_arrive = array("q", created)
        elif 0 not in gpu:
            rp.c_arrive = gpu
        else:
            rp.c_arrive = _or_else(gpu, created)
        rp.c_record = _times(record, 0)
        return
    # the general path: one record per seq (a coalesced group is one record)
    recs = [_record(q, g, offset) for q, g in sorted(groups.items()) if q > dropped]
    if not recs:
        return
    table = rp.sigs
    sig_col = array("i")
    for r in recs:
        sid = sig_ids.get(r[1])
        if sid is None:
            sid = sig_ids[r[1]] = len(table)
            table.append(r[1])
        sig_col.append(sid)
    cols = list(zip(*recs))
    rp.c_seq = array("q", cols[0])
    rp.c_sig = sig_col
    rp.c_state = bytes(cols[2])
    rp.c_created, rp.c_started, rp.c_completed, rp.c_arrive, rp.c_record, rp.c_end = (array("q", c)
                                                                                     for c in cols[3:9])


def _sig_column(ents: list[dict[str, Any]], sig_ids: dict[Sig, int], table: list[Sig]) -> array:
    """One Sig id per entry; the Sig is worked out once per run of identical (name, sizes, dtypes)."""
    try:
        rows = list(map(itemgetter(*_SIG_KEYS), ents))
    except KeyError:
        rows = [tuple(e.get(k) for k in _SIG_KEYS) for e in ents]
    starts = list(compress(range(len(rows)), map(ne, rows, chain((None,), rows))))
    starts.append(len(rows))
    out = array("i")
    for a, b in pairwise(starts):
        sig = _sig_of(rows[a], ents[a])
        sid = sig_ids.get(sig)
        if sid is None:
            sid = sig_ids[sig] = len(table)
            table.append(sig)
        if b - a == 1:
            out.append(sid)
        else:
            out.extend(repeat(sid, b - a))
    return out


def _sig_of(row: tuple[Any, ...], e: dict[str, Any]) -> Sig:
    try:
        key = marshal.dumps(row, 2)
    except (ValueError, TypeError):  # not plain data marshal knows: no caching
        return _single_sig(e)
    sig = _SIG_CACHE.get(key)
    if sig is None:
        if len(_SIG_CACHE) >= _CACHE_MAX:
            _SIG_CACHE.clear()
        sig = _SIG_CACHE[key] = _single_sig(e)
    return sig


def _single_sig(e: dict[str, Any]) -> Sig:
    op, _, _, fam = _opinfo(e["profiling_name"])
    if fam == "none":
        return (op, op, "", "", 1)
    sk, dk = _keys(fam, e)
    return (op, op, sk, dk, 1)


def _record(seq: int, group: list[dict[str, Any]], offset: int) -> tuple[Any, ...]:
    """(seq, sig, state, created, started, completed, arrive, record_id, end) of one seq's entries."""
    if len(group) == 1:
        e = group[0]
        sig = _single_sig(e)
        ref = e
        state = _state(e.get("state"))
        created = _ns(e.get("time_created_ns"), offset)
    else:
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
        sig = (display, names_key, "|".join(k[0] for k in keys), "|".join(k[1] for k in keys), max(1, len(ops)))
        if marker is not None:
            state = _state(marker.get("state"))
            ref = marker
        else:  # group not closed yet: as far as the slowest op got
            state = min(_state(e.get("state")) for _, e in ops)
            ref = ops[-1][1]
        created = _ns(min(_i64(e.get("time_created_ns")) for e in group), offset)
    gpu = _ns(ref.get("time_gpu_started_ns"), offset)
    done = _ns(ref.get("time_discovered_completed_ns"), offset)
    return (seq, sig, state, created, _ns(ref.get("time_discovered_started_ns"), offset), done, gpu or created,
            _ns(ref.get("record_id"), 0), _ns(ref.get("time_gpu_completed_ns"), offset) or done)


def _keys(fam: str, e: dict[str, Any]) -> tuple[str, str]:
    """(sizes key, dtypes key) of one op: the sizes that must agree across ranks for its family."""
    if fam == "both":
        return f"{e.get('input_sizes')}>{e.get('output_sizes')}", _dtkey(e.get("input_dtypes"))
    if fam == "out":
        return f">{e.get('output_sizes')}", _dtkey(e.get("output_dtypes"))
    if fam == "in":
        return f"{e.get('input_sizes')}>", _dtkey(e.get("input_dtypes"))
    if fam == "dtype":  # all_to_all*, all_gather_v, reduce_scatter_v: sizes differ per rank, dtypes may not
        ins, outs = e.get("input_dtypes"), e.get("output_dtypes")
        if type(ins) is list and type(outs) is list:
            return "", _dtkey(ins + outs)
        return "", _dtkey(ins if ins else outs)
    return "", ""


def _dtkey(dts: Any) -> str:
    if type(dts) is list:
        if len(dts) == 1:
            return str(dts[0])
        return ",".join(sorted({str(x) for x in dts if x}))
    return str(dts) if dts else ""


def _infer_dropped(lo: int | None, first_in_lo: bool, last_enqueued: int, truncated: bool) -> int:
    """Torch dumps carry no last_dropped: history below the oldest seq kept is unknown; the oldest
    group of a cut buffer may have lost its first ops, so it counts as cut too."""
    if lo is None:
        return last_enqueued if truncated or last_enqueued > 0 else -1
    if truncated and first_in_lo:
        return lo
    return lo - 1 if lo > 1 else -1


# --------------------------------------------------------------------------- p2p


def _p2p_ops(rp: RankPg, ents: list[dict[str, Any]], first: dict[str, Any] | None, truncated: bool, fmt: str,
             offset: int) -> None:
    groups: dict[int, list[dict[str, Any]]] = {}
    for e in ents:
        groups.setdefault(_int(e.get("p2p_seq_id")), []).append(e)
    if rp.dropped_p2p == -2 or (rp.dropped_p2p == -1 and fmt == "torch"):
        lo = min(groups) if groups else None
        rp.dropped_p2p = _infer_dropped(lo, lo is not None and any(e is first for e in groups[lo]),
                                        rp.last_enqueued_p2p, truncated)
    for seq, group in groups.items():
        if seq > rp.dropped_p2p:
            rp.p2ps.extend(_make_p2ps(seq, group, offset, rp.ranks))
            if fmt == "frnccl" and any(e.get("retired") is True and e.get("state") != "completed" for e in group):
                rp.failed_p2p.add(seq)  # retired without completing: it failed
    if groups:
        rp.last_enqueued_p2p = max(rp.last_enqueued_p2p, max(groups))
    rp.last_enqueued_p2p = max(rp.last_enqueued_p2p, rp.dropped_p2p)


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
        if op == "send":
            sizes, dts = e.get("input_sizes"), e.get("input_dtypes")
        else:
            sizes, dts = e.get("output_sizes"), e.get("output_dtypes")
        out.append((seq, op, peer, _intern(str(sizes)), _intern(_dtkey(dts)), _state(ref.get("state")),
                    _ns(e.get("time_created_ns"), offset), _ns(ref.get("time_discovered_started_ns"), offset),
                    _ns(ref.get("time_discovered_completed_ns"), offset), _int(e.get("record_id")),
                    _intern(str(e["profiling_name"]))))
    return out


def _peer_from_meta(op: str, meta: str, ranks: tuple[int, ...]) -> int:
    """'0->1' (send) or '1<-0' (recv) hold group-local ranks; map the peer to a global rank."""
    try:
        local = int(meta.split("->")[1]) if op == "send" else int(meta.split("<-")[1])
    except (IndexError, ValueError):
        return -1
    if ranks and 0 <= local < len(ranks):
        return ranks[local]
    return local if not ranks else -1


# --------------------------------------------------------------------------- small helpers


def _intern(v: str) -> str:
    """One object per distinct string (p2p records): kept once in memory and in the pickle to the parent."""
    got = _STRINGS.get(v)
    if got is None:
        if len(_STRINGS) >= _CACHE_MAX:
            _STRINGS.clear()
        got = _STRINGS[v] = v
    return got


def _opinfo(prof: Any) -> tuple[str, str, bool, str]:
    """profiling_name -> (op, meta, is_marker, op_family), cached."""
    info = _OPINFO.get(prof) if type(prof) is str else None
    if info is None:
        op, meta = split_name(prof)
        info = (op, meta, is_marker(op), family(op))
        if type(prof) is str:
            if len(_OPINFO) >= _CACHE_MAX:
                _OPINFO.clear()
            _OPINFO[prof] = info
    return info


# per entry, in one pass: is_p2p, then what a collective's columns are made of, then retired, then the GPU end
_ROW_KEYS = ("is_p2p", "collective_seq_id", "state", "time_created_ns", "time_discovered_started_ns",
             "time_discovered_completed_ns", "time_gpu_started_ns", "record_id", "retired", "time_gpu_completed_ns")


def _cols(ents: list[dict[str, Any]], keys: tuple[str, ...]) -> list[Sequence[Any]]:
    """Columns of ``keys`` over ``ents`` (None where an entry lacks a key): one C-level pass for the
    keys the first entry has."""
    if not ents:
        return [() for _ in keys]
    e0 = ents[0]
    have = [k for k in keys if k in e0]
    try:
        got = dict(zip(have, zip(*map(itemgetter(*have), ents)))) if len(have) > 1 else {}
    except KeyError:
        got = {}
    return [got[k] if k in got else _col(ents, k) for k in keys]


def _col(ents: list[dict[str, Any]], key: str) -> list[Any]:
    try:
        return list(map(itemgetter(key), ents))
    except KeyError:
        return [e.get(key) for e in ents]


def _int(v: Any, default: int = 0) -> int:
    if type(v) is int:
        return v
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return default


def _i64(v: Any) -> int:
    v = _int(v)
    return v if _I64_MIN <= v <= _I64_MAX else 0


def _ns(v: Any, offset: int) -> int:
    """A time (or id) as int64: 0 when unknown or not a number; corrected by the clock offset."""
    v = _i64(v)
    if not v:
        return 0
    v -= offset
    return v if _I64_MIN <= v <= _I64_MAX else 0


def _times(vals: Sequence[Any], offset: int) -> array:
    """int64 column of times (or ids) corrected by ``offset``; 0 where unknown or not a number."""
    try:
        if not offset:
            try:
                return array("q", vals)  # plain ints: straight into C
            except TypeError:  # None somewhere
                return array("q", [x or 0 for x in vals])
        return array("q", [x - offset if x else 0 for x in vals])
    except (TypeError, OverflowError):
        return array("q", [_ns(x, offset) for x in vals])


def _or_else(col: array, other: array) -> array:
    """``col``, with ``other``'s value where col's is 0 (unknown): the zeros are few, found in C."""
    out = array("q", col)
    for i in compress(range(len(col)), map(not_, col)):
        out[i] = other[i]
    return out


def _state(v: Any) -> int:
    return _STATE.get(v, SCHEDULED) if type(v) is str else SCHEDULED


def _states(vals: Sequence[Any]) -> bytes:
    try:
        return bytes(map(_STATE.get, vals, repeat(SCHEDULED)))
    except TypeError:
        return bytes(map(_state, vals))


def _hashable(k: Any) -> Any:
    if isinstance(k, list):
        return tuple(_hashable(x) for x in k)
    try:
        hash(k)
    except TypeError:
        raise DumpError(_BAD_ENTRY) from None
    return k


def _pg_ranks(cfg: dict[str, Any]) -> tuple[int, ...]:
    """The PG's members as global ranks, ascending (raises DumpError for implausible ones)."""
    rs = _members(cfg)
    if rs and (rs[0] < 0 or rs[-1] >= MAX_RANKS):
        raise DumpError(f"implausible rank in pg_config ({str(rs[0] if rs[0] < 0 else rs[-1])[:24]})")
    return rs


def _members(cfg: dict[str, Any]) -> tuple[int, ...]:
    gr = cfg.get("global_ranks")
    if isinstance(gr, (list, tuple)):
        return _sorted_ints(gr)
    rs = cfg.get("ranks")
    if isinstance(rs, str):  # torch writes str(list): "[0, 1, 2]"
        if len(rs) > 1 << 24:
            raise DumpError("pg_config ranks too long")
        try:
            val = json.loads(rs)
        except ValueError:
            try:
                val = ast.literal_eval(rs)
            except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
                return ()
        except RecursionError:
            return ()
        if isinstance(val, (list, tuple, set)):
            return _sorted_ints(val)
        return ()
    if isinstance(rs, (list, tuple)):
        return _sorted_ints(rs)
    return ()


def _sorted_ints(vals: Any) -> tuple[int, ...]:
    # Every dump of a job lists the default group's members, world_size of them: converted once per process
    # (a hit is a hash and a compare in C; equal lists convert alike, 1.0 == 1 included; the list columnar.py
    # shares between dumps is the same object).
    if vals is _MEMBERS_LAST[0]:
        return _MEMBERS_LAST[1]
    try:
        key: tuple[Any, ...] | None = tuple(vals) if len(vals) >= _MEMBERS_MIN else None
        got = _MEMBERS.get(key) if key is not None else None
    except TypeError:  # not a sized iterable of hashable values: converted (and refused) below
        key = got = None
    if got is not None:
        return got
    try:
        out = tuple(sorted(map(int, vals)))
    except (TypeError, ValueError, OverflowError):
        raise DumpError("pg_config: member ranks are not integers") from None
    if key is not None:
        if len(_MEMBERS) >= _MEMBERS_MAX:
            _MEMBERS.clear()
        _MEMBERS[key] = out
    return out


def share_members(vals: list[Any]) -> None:
    """columnar.py puts this one list object in every dump that holds its text: its conversion is kept by
    identity (the list is held here, so its id is not reused; nothing writes to it)."""
    _MEMBERS_LAST[:] = [None, ()]
    _MEMBERS_LAST[:] = [vals, _sorted_ints(vals)]


_MEMBERS: dict[tuple[Any, ...], tuple[int, ...]] = {}
_MEMBERS_MIN, _MEMBERS_MAX = 64, 64
_MEMBERS_LAST: list[Any] = [None, ()]


# A frame of torch's own code that issues collectives (distributed_c10d.all_reduce and its logging decorators,
# DDP, FSDP), in an installed torch or a source checkout.
_TORCH_FILE = re.compile(r"(^|[/\\])torch[/\\](distributed|nn[/\\]parallel)[/\\]")


def _frame(e: dict[str, Any]) -> str:
    """Where the op was called from: the innermost frame outside torch's own wrappers, else the innermost."""
    frames = [f for f in e.get("frames") or () if isinstance(f, dict)] if isinstance(e.get("frames"), list) else []
    if not frames:
        return ""
    f = next((f for f in frames if not _TORCH_FILE.search(str(f.get("filename", "")))), frames[0])
    return f"{f.get('name', '?')} ({f.get('filename', '?')}:{f.get('line', '?')})"
