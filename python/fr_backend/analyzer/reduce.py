"""Reduce one raw dump dict in the row form (``entries`` a list of dicts) to its compact
:class:`RankSummary`, as soon as it is read; columnar.py does the same from a compact dump's columns.

What survives is what the analysis needs: per PG and per seq a signature id (op names, sizes and
dtypes, shared by every op that looked the same), the state and a few times, as columns; stack
frames, thread names and every other field go away with the raw dict. The header, the groups and
their status are read by header.py, each field's value by fields.py, for both readers alike.

The usual shape of a dump (every entry a dict with the usual keys, seqs ascending and contiguous
per PG) is reduced column-wise in C (``itemgetter``, ``array``); signatures are computed once
per run of identical ops. Anything else (coalesced groups sharing a seq, missing keys, odd
types, torch dumps without ``is_p2p``) takes a slower, tolerant path with the same result.
"""

from __future__ import annotations

import marshal
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from itertools import chain, compress, pairwise, repeat
from operator import contains, eq, itemgetter, ne
from typing import Any

from .fields import (
    CACHE_MAX,
    ROW_KEYS,
    SIG_KEYS,
    as_i64,
    as_int,
    as_ns,
    compare_keys,
    contiguous,
    dtype_key,
    infer_dropped,
    interned,
    opinfo,
    or_else,
    single_sig,
    state_code,
    state_codes,
    times_column,
)
from .header import FRAMES_KEPT, Header, mark_failed
from .model import P2P, DumpError, RankPg, RankSummary, Sig
from .ops import family

_GET_PG = itemgetter("process_group")
_GET_PROF = itemgetter("profiling_name")
_BAD_ENTRY = "an entry lacks process_group or profiling_name"

# Per process: the marshalled raw (profiling_name, sizes, dtypes) of an op -> its Sig (bounded: CACHE_MAX).
_SIG_CACHE: dict[bytes, Sig] = {}


def summarize_rows(d: dict[str, Any], path: str, rank_hint: int | None) -> RankSummary:
    """Reduce a raw dump dict in the row form to the compact RankSummary (raises DumpError)."""
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
            per_pg[name] = entries if len(ix) == len(entries) else list(map(entries.__getitem__, ix))

    with_status = h.status(pg_id_to_name)
    first = entries[0] if entries else None
    truncated = first is not None and as_int(first.get("record_id"), 0) > 0
    sig_ids: dict[Sig, int] = {}
    for name, rp in pgs.items():
        ents = per_pg.get(name, [])
        cols = _cols(ents, ROW_KEYS)
        flags = cols[0]
        if ents and (None in flags or any(flags)):  # p2p ops in this PG (or torch dumps without is_p2p)
            colls, p2ps = _split_p2p(ents, flags)
            cols = _cols(colls, ROW_KEYS)
        else:
            colls, p2ps = ents, []
        coll_columns(rp, colls, cols, first, truncated, h.fmt, h.offset, sig_ids)
        p2p_ops(rp, p2ps, first, truncated, h.fmt, h.offset)
        mark_failed(s, rp, cols, h.fmt, name in with_status)
    h.finish(entries[-FRAMES_KEPT:], last_rp)
    return s


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


def _hashable(k: Any) -> Any:
    if isinstance(k, list):
        return tuple(_hashable(x) for x in k)
    try:
        hash(k)
    except TypeError:
        raise DumpError(_BAD_ENTRY) from None
    return k


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


def _col(ents: list[dict[str, Any]], key: str) -> Sequence[Any]:
    try:
        return list(map(itemgetter(key), ents))
    except KeyError:
        if not any(map(contains, ents, repeat(key))):  # a key this writer never writes (torch: GPU times)
            return (None,) * len(ents)
        return [e.get(key) for e in ents]


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
            op, _, mark, _ = opinfo(e["profiling_name"])
            pseq = as_int(e.get("p2p_seq_id"))
            p = op in ("send", "recv") or (mark and prev == pseq)
            prev = pseq if p else None
        (p2ps if p else colls).append(e)
    return colls, p2ps


def coll_columns(rp: RankPg, ents: list[dict[str, Any]], cols: list[Sequence[Any]], first: dict[str, Any] | None,
                 truncated: bool, fmt: str, offset: int, sig_ids: dict[Sig, int],
                 sig_column: Callable[[int], array] | None = None) -> None:
    """Fill rp's collective columns from its collective entries (``cols``: their ROW_KEYS columns).
    columnar.py passes no rows: ``ents`` then only says whether the first is ``first``, and
    ``sig_column(start)`` gives the signature ids of the entries from ``start`` on (contiguous seqs only)."""
    _, seqs, states, created, started, completed, gpu, record, _, gpu_end = cols[:10]
    n = len(seqs)
    fast = contiguous(seqs)
    if fast:
        lo, hi = seqs[0], seqs[-1]
        first_in_lo = ents[0] is first
    else:
        groups: dict[int, list[dict[str, Any]]] = {}
        for e, q in zip(ents, seqs):
            groups.setdefault(q if type(q) is int else as_int(q), []).append(e)
        lo = min(groups) if groups else 0
        hi = max(groups) if groups else 0
        first_in_lo = bool(groups) and any(e is first for e in groups[lo])
    if rp.dropped_coll == -2 or (rp.dropped_coll == -1 and fmt == "torch"):
        rp.dropped_coll = infer_dropped(lo if n else None, first_in_lo, rp.last_enqueued_coll, truncated)
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
        rp.c_state = state_codes(states)
        created = rp.c_created = times_column(created, offset)
        rp.c_started = times_column(started, offset)
        rp.c_completed = times_column(completed, offset)
        gpu_end = times_column(gpu_end, offset)
        if not any(gpu_end):
            rp.c_end = rp.c_completed
        elif 0 not in gpu_end:
            rp.c_end = gpu_end
        else:
            rp.c_end = or_else(gpu_end, rp.c_completed)
        gpu = times_column(gpu, offset)
        if not any(gpu):
            rp.c_arrive = array("q", created)
        elif 0 not in gpu:
            rp.c_arrive = gpu
        else:
            rp.c_arrive = or_else(gpu, created)
        rp.c_record = times_column(record, 0)
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
        rows = list(map(itemgetter(*SIG_KEYS), ents))
    except KeyError:
        rows = [tuple(e.get(k) for k in SIG_KEYS) for e in ents]
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
        return single_sig(e)
    sig = _SIG_CACHE.get(key)
    if sig is None:
        if len(_SIG_CACHE) >= CACHE_MAX:
            _SIG_CACHE.clear()
        sig = _SIG_CACHE[key] = single_sig(e)
    return sig


def _record(seq: int, group: list[dict[str, Any]], offset: int) -> tuple[Any, ...]:
    """(seq, sig, state, created, started, completed, arrive, record_id, end) of one seq's entries."""
    if len(group) == 1:
        e = group[0]
        sig = single_sig(e)
        ref = e
        state = state_code(e.get("state"))
        created = as_ns(e.get("time_created_ns"), offset)
    else:
        marker: dict[str, Any] | None = None
        ops: list[tuple[str, dict[str, Any]]] = []
        for e in group:
            op, _, mark, _ = opinfo(e["profiling_name"])
            if mark:
                marker = e
            else:
                ops.append((op, e))
        names = [o for o, _ in ops]
        if marker is not None:
            mname = opinfo(marker["profiling_name"])[0]
            display = f"{mname}[{','.join(names)}]" if names else mname
            names_key = ",".join(names) if names else mname
        else:
            display = f"coalesced[{','.join(names)}]"
            names_key = ",".join(names)
        keys = [compare_keys(family(o), e) for o, e in ops]
        sig = (display, names_key, "|".join(k[0] for k in keys), "|".join(k[1] for k in keys), max(1, len(ops)))
        if marker is not None:
            state = state_code(marker.get("state"))
            ref = marker
        else:  # group not closed yet: as far as the slowest op got
            state = min(state_code(e.get("state")) for _, e in ops)
            ref = ops[-1][1]
        created = as_ns(min(as_i64(e.get("time_created_ns")) for e in group), offset)
    gpu = as_ns(ref.get("time_gpu_started_ns"), offset)
    done = as_ns(ref.get("time_discovered_completed_ns"), offset)
    return (seq, sig, state, created, as_ns(ref.get("time_discovered_started_ns"), offset), done, gpu or created,
            as_ns(ref.get("record_id"), 0), as_ns(ref.get("time_gpu_completed_ns"), offset) or done)

# --------------------------------------------------------------------------- p2p


def p2p_ops(rp: RankPg, ents: list[dict[str, Any]], first: dict[str, Any] | None, truncated: bool, fmt: str,
            offset: int) -> None:
    groups: dict[int, list[dict[str, Any]]] = {}
    for e in ents:
        groups.setdefault(as_int(e.get("p2p_seq_id")), []).append(e)
    if rp.dropped_p2p == -2 or (rp.dropped_p2p == -1 and fmt == "torch"):
        lo = min(groups) if groups else None
        rp.dropped_p2p = infer_dropped(lo, lo is not None and any(e is first for e in groups[lo]),
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
        if opinfo(e["profiling_name"])[2]:
            marker = e
    out: list[P2P] = []
    for e in group:
        op, meta, _, _ = opinfo(e["profiling_name"])
        if op not in ("send", "recv"):
            continue
        peer = as_int(e.get("peer", -1), -1)
        if peer < 0 and meta:
            peer = _peer_from_meta(op, meta, ranks)
        ref = marker if marker is not None else e
        if op == "send":
            sizes, dts = e.get("input_sizes"), e.get("input_dtypes")
        else:
            sizes, dts = e.get("output_sizes"), e.get("output_dtypes")
        out.append((seq, op, peer, interned(str(sizes)), interned(dtype_key(dts)), state_code(ref.get("state")),
                    as_ns(e.get("time_created_ns"), offset), as_ns(ref.get("time_discovered_started_ns"), offset),
                    as_ns(ref.get("time_discovered_completed_ns"), offset), as_int(e.get("record_id")),
                    interned(str(e["profiling_name"]))))
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
