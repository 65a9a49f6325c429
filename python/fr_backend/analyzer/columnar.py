"""Reducing a compact (columns-1 or columns-2) dump from its columns, without building its rows.

The row path (compact.to_rows, then reduce.summarize_rows) builds one dict per entry, 2,000 a rank,
to read ten of their keys; here each needed column is taken as it is, a group's entries are picked
from it in C (a byte per entry says its group: a mask of those bytes, for itertools.compress), integer
columns are packed into arrays by struct, and what is worked out per op (its signature:
profiling_name, sizes, dtypes; its state) is worked out once per distinct table value or combination
of them. The summary is the one the row path gives: the same steps (reduce.py, header.py, fields.py)
run on the same column values.

Only the usual shape is read this way: a valid file (every column of a known form and length),
every entry of a group a collective (``is_p2p`` false), seqs ascending and contiguous per group,
op signature columns table-coded. Anything else (p2p ops, coalesced groups sharing a seq, torch
dumps without ``is_p2p``, a column of an odd form or type) goes the row path, which is where the
reasons for refusing a damaged file come from: a file is never refused here that the row path
would read, nor read differently.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
from array import array
from collections.abc import Callable, Iterator
from itertools import accumulate, compress
from operator import add, is_
from typing import Any

from fr_backend import compact

from . import bounds
from . import dumpfile
from .dumpfile import address_space, parse_dump, read_regular
from .fields import (
    ROW_KEYS,
    SIG_KEYS,
    as_int,
    contiguous,
    infer_dropped,
    or_else,
    single_sig,
    state_code,
    state_codes,
    times_column,
)
from .header import FRAMES_KEPT, Header, mark_failed, share_members, untrusted_states
from .model import COMPLETED, DumpError, RankPg, RankSummary, Sig
from .reduce import coll_columns, p2p_ops, summarize_rows

__all__ = ["Columns", "read_dump", "summarize_columns"]

_NEWEST_KEYS = ("is_p2p", "p2p_seq_id", "collective_seq_id", "state", "profiling_name", "record_id", "frames",
                "process_group", "thread_id")


class Columns:
    """A parsed compact dump whose entries are still columns: what read_dump gives for the compact
    encoding, and what load.summarize reduces through summarize_columns."""

    __slots__ = ("obj", "nbytes")

    def __init__(self, obj: dict[str, Any], nbytes: int) -> None:
        self.obj, self.nbytes = obj, nbytes


def read_dump(path: str | os.PathLike[str]) -> dict[str, Any] | Columns:
    """A dump file for load.summarize: a compact one as its columns, any other as load_dump reads it
    (raises DumpError as load_dump does)."""
    data = read_regular(os.fspath(path))
    if not (data and compact.is_compact(data)):
        return parse_dump(data)
    with _bounded(len(data)):
        obj = _parse(data)
        return Columns(obj, len(data)) if obj.get("encoding") in compact.ENCODINGS else _rows(obj)


@contextlib.contextmanager
def _bounded(nbytes: int) -> Iterator[None]:
    # What parsing may take beyond the process's size, as dumpfile.parse_compact bounds it.
    try:
        with address_space(dumpfile.COMPACT_FLOOR + dumpfile.COMPACT_PER_BYTE * nbytes):
            yield
    except MemoryError:
        raise DumpError(f"refused: reading it takes more memory than a compact dump of {nbytes} bytes can "
                        "(it inflates far past what a dump holds)") from None


def _rows(obj: dict[str, Any]) -> dict[str, Any]:
    """The row form of a parsed compact dump, as load_dump gives it (the path for anything unusual)."""
    obj = compact.to_rows(obj)
    if "entries" not in obj and "pg_config" not in obj:
        raise DumpError("not a flight-recorder dump (no entries or pg_config)")
    bounds.normalize(obj)
    return obj


# In dumps from before the members text, the default group's members (pg_config global_ranks) are the same
# text in every dump of a job, world_size numbers long: a third of what there is to parse at 16,384 ranks. Per process, the last few such lists are
# kept with their text; where a dump holds one of those texts, it is cut out before parsing and the kept list
# put back.
_MEMBERS_KEY = b'"global_ranks":'
_MEMBERS_MIN_BYTES = 4096
_MEMBERS_KEPT = 8
_MEMBERS_TAG = "\x01frnccl-members-" + os.urandom(8).hex() + "-"  # a string no file can know
_members: dict[bytes, list[int]] = {}  # text of a member list -> the list (shared; nothing writes to it)


def _parse(data: bytes) -> dict[str, Any]:
    """compact.parse, known member lists parsed once per process; the same object, or compact.parse's
    own answer (its DumpError) wherever anything is unusual."""
    text = compact.inflate(data)
    try:
        cut: list[tuple[int, int, list[int]]] = []
        i = text.find(_MEMBERS_KEY)
        while i >= 0:
            a = i + len(_MEMBERS_KEY)
            while text[a:a + 1] in (b" ", b"\n", b"\r", b"\t"):
                a += 1
            b = text.find(b"]", a) + 1
            if b <= 0 or text[a:a + 1] != b"[":
                break
            if b - a >= _MEMBERS_MIN_BYTES:
                span = text[a:b]
                got = _members.get(span)
                if got is None:
                    got = json.loads(span.decode("utf-8", "surrogatepass"))
                    if type(got) is not list or not _ints(got):
                        break
                    if len(_members) >= _MEMBERS_KEPT:
                        _members.clear()
                    _members[span] = got
                    share_members(got)
                cut.append((a, b, got))
            i = text.find(_MEMBERS_KEY, b)
        if not cut:
            obj = json.loads(text.decode("utf-8", "surrogatepass"))  # UTF-8 only, as compact.parse
        else:
            parts, last = [], 0
            for k, (a, b, _) in enumerate(cut):
                parts += [text[last:a], json.dumps(f"{_MEMBERS_TAG}{k}").encode()]
                last = b
            parts.append(text[last:])
            obj = json.loads(b"".join(parts).decode("utf-8", "surrogatepass"))
            lists = {f"{_MEMBERS_TAG}{k}": got for k, (_, _, got) in enumerate(cut)}
            put = 0
            cfgs = obj.get("pg_config") if type(obj) is dict else None
            for cfg in cfgs.values() if type(cfgs) is dict else ():
                if type(cfg) is dict and type(v := cfg.get("global_ranks")) is str and v in lists:
                    cfg["global_ranks"] = lists.pop(v)
                    put += 1
            if put != len(cut):  # a list elsewhere than in pg_config: parsed as it is
                return compact.parse(data)
        if type(obj) is not dict:
            return compact.parse(data)
    except Exception:  # noqa: BLE001 - compact.parse says what is wrong in its own words
        return compact.parse(data)
    obj["_inflated_bytes"] = len(text)
    return obj


class _Fallback(Exception):
    """Not the usual shape: the row path reads it."""


class _Table:
    __slots__ = ("table", "index")

    def __init__(self, table: list[Any], index: list[int]) -> None:
        self.table, self.index = table, index


class _Delta:
    """A delta column, summed only where read: of some keys (op_id, record_id) the analysis reads a few
    values or none."""

    __slots__ = ("deltas", "start", "sums")

    def __init__(self, deltas: array | list[int], start: int) -> None:
        self.deltas, self.start = deltas, start
        self.sums: list[int] = []

    def upto(self, i: int) -> list[int]:
        """The values of entries 0..i (at least)."""
        if len(self.sums) <= i:
            self.sums = list(accumulate(self.deltas[:i + 1] if i < 64 else self.deltas, initial=self.start))
            del self.sums[0]
        return self.sums


def summarize_columns(cd: Columns, path: str, rank_hint: int | None) -> RankSummary:
    """The RankSummary of a compact dump, as reduce.summarize_rows gives for its rows (raises DumpError)."""
    obj = cd.obj
    try:
        # A huge start or base times N entries: no more memory than the row path may take (past it, MemoryError,
        # and the row path says what it makes of the file)
        with address_space(dumpfile.COMPACT_FLOOR + dumpfile.COMPACT_PER_BYTE * cd.nbytes):
            cols = _valid_columns(obj)
            if cols is not None:
                return _summarize(obj, cols, path, rank_hint)
    except DumpError:
        raise  # from the header, which both paths read alike, and only once the columns are known good
    except Exception:  # noqa: BLE001 - _Fallback, or what the row path is to report in its own words
        pass
    with _bounded(cd.nbytes):
        rows = _rows(obj)
    return summarize_rows(rows, path, rank_hint)


def _ints(vals: list[Any]) -> bool:
    return set(map(type, vals)) <= {int}


# Per process: the last index list of each column found to be exact ints (and its largest). The dumps of one
# job are alike: an index list element for element the same objects (small ints are; True is not 1) is one
# already checked, and the check is an identity scan in C.
_KNOWN: dict[tuple[str, str], tuple[list[int], int]] = {}  # ("delta" or "index", column key) -> (list, largest)
_KNOWN_MAX = 256


_INT_OR_NONE = {int, type(None)}


def _known(key: tuple[str, str], vals: list[Any], size: int | None = None) -> bool:
    """Whether ``vals`` are the very objects of the last list of ``key`` found to be integers (and, for an
    index, below ``size``)."""
    got = _KNOWN.get(key)
    return (got is not None and len(got[0]) == len(vals) and (size is None or got[1] < size)
            and all(map(is_, vals, got[0])))


def _remember(key: tuple[str, str], vals: list[int], top: int = 0) -> None:
    if len(_KNOWN) >= _KNOWN_MAX:
        _KNOWN.clear()
    _KNOWN[key] = (vals, top)


def _valid_columns(obj: dict[str, Any]) -> dict[str, Column] | None:
    """key -> its values (a table column: its table and index) when compact.to_rows would surely read the file
    and the entries are worth reading here; else None (then the row path reads it, or says what is wrong)."""
    ents = obj.get("entries")
    if type(ents) is not dict:
        return None
    n, cols = ents.get("count"), ents.get("columns")
    if type(n) is not int or n <= 0 or type(cols) is not dict:
        return None
    inflated = obj.get("_inflated_bytes", 0)
    limit = compact.UNFOLD_FLOOR + compact.UNFOLD_FACTOR * inflated
    if inflated + compact.integer_bytes(cols, n) > limit:
        return None  # the integers alone would be past the row path's bound, which refuses the file before decoding
    # what the rows could unfold to, at most (each value its whole table): when past the row path's bomb bound,
    # the row path's own count decides
    bound = inflated
    out: dict[str, Column] = {}
    pending: list[tuple[str, dict[str, Any]]] = []
    exact: set[str] = set()  # columns whose values are integers (decoded from integer deltas, or offsets)
    for key, col in cols.items():
        if type(col) is list:
            if len(col) != n:
                return None
            out[key] = col
        elif type(col) is dict and "offset_from" in col:
            pending.append((key, col))
        elif type(col) is dict and "delta" in col:
            d = col["delta"]
            try:
                start = compact.delta_start(col, key)
                packed = compact.packed_ints(d, n, key) if type(d) is str else None
            except DumpError:
                return None
            if packed is not None:
                out[key] = _Delta(packed, start)
            else:
                if type(d) is not list or len(d) != n or not (_known(("delta", key), d) or _ints(d)):
                    return None  # integers only (compact.columns refuses others, or a later version of it does)
                _remember(("delta", key), d)  # an index list of the same key is checked for its range as well
                out[key] = _Delta(d, start)
            exact.add(key)
        elif type(col) is dict and "table" in col:
            table, index = col["table"], col.get("index")
            if type(table) is not list:
                return None
            if type(index) is str:
                try:
                    index = compact.positions(index, len(table), n, key)  # bytes: a position per byte
                except DumpError:
                    return None
            elif type(index) is not list or len(index) != n:
                return None
            elif not _known(("index", key), index, len(table)):
                if not _ints(index):
                    return None
                used = set(index)  # a few distinct positions: their bounds are quick to check
                if min(used) < 0 or max(used) >= len(table):
                    return None
                _remember(("index", key), index, max(used))
            bound += n * len(json.dumps(table, separators=(",", ":")))  # at least its largest value, times n
            out[key] = _Table(table, index)
        else:
            return None
    decoded: dict[tuple[str, str], list[int]] = {}  # offsets of the same text from the same base: one list
    for key, col in pending:
        base_key, offs = col.get("offset_from"), col.get("values")
        base = out.get(base_key) if isinstance(base_key, str) else None
        if type(base) is _Table or type(base) is _Delta:
            base = _values(base, n)
        if type(base) is not list or not (base_key in exact or _ints(base)):
            return None  # integers only, as for deltas
        if type(offs) is str:
            same = decoded.get((base_key, offs))
            if same is not None:  # e.g. GPU times equal to the discovered ones (CPU ops)
                out[key] = same
                exact.add(key)
                continue
            try:
                packed = compact.packed_ints(offs, n, key)
            except DumpError:
                return None
            null_text = "8".ljust(len(offs) // n, "0")
            if offs == null_text * n:  # no time seen at all (GPU times of CPU ops)
                vals = [0] * n
            else:
                vals = list(map(add, base, packed))
                if null_text in offs:  # maybe a few not seen (ops still running); the text also matches unaligned
                    null, at = compact.null_of(packed), -1
                    for _ in range(packed.count(null)):
                        at = packed.index(null, at + 1)
                        vals[at] = 0
            decoded[(base_key, offs)] = out[key] = vals
        else:
            if type(offs) is not list or len(offs) != n or not set(map(type, offs)) <= _INT_OR_NONE:
                return None
            out[key] = ([0 if o is None else b + o for b, o in zip(base, offs)] if None in offs
                        else list(map(add, base, offs)))
        exact.add(key)
    if bound > limit and compact.unfolded_bytes(obj) > limit:
        return None  # the row path refuses it
    return out


Column = list[Any] | _Table | _Delta


def _values(col: Column | None, n: int) -> list[Any]:
    if col is None:
        return [None] * n
    if type(col) is _Table:
        return list(map(col.table.__getitem__, col.index))
    if type(col) is _Delta:
        return col.upto(n - 1)
    return col


def _at(col: Column | None, ix: list[int], n: int) -> list[Any]:
    """The values of entries ``ix`` (ascending positions)."""
    if len(ix) == n:
        return _values(col, n)
    if col is None:
        return [None] * len(ix)
    if type(col) is _Table:
        return list(map(col.table.__getitem__, map(col.index.__getitem__, ix)))
    if type(col) is _Delta:
        col = col.upto(ix[-1]) if ix else []
    return list(map(col.__getitem__, ix))


def _one(col: Column | None, i: int) -> Any:
    """The value of entry ``i``."""
    if col is None:
        return None
    if type(col) is _Table:
        return col.table[col.index[i]]
    if type(col) is _Delta:
        return col.upto(i)[i]
    return col[i]


def _take(col: Column | None, mask: bytes | None, n: int, m: int) -> list[Any]:
    """The values of the entries whose ``mask`` byte is 1 (``m`` of them; ``mask`` None: all ``n``), picked
    in C."""
    if mask is None:
        return _values(col, n)
    if col is None:
        return [None] * m
    if type(col) is _Table:
        table = col.table
        if len(table) == 1:
            return [table[0]] * m
        return list(map(table.__getitem__, compress(col.index, mask)))
    if type(col) is _Delta:
        col = col.upto(n - 1)
    return list(compress(col, mask))


def _codes(index: list[int], size: int) -> bytes | None:
    """A table column's index as bytes (None when the table is too large for one byte a value)."""
    if size > 256:
        return None
    if type(index) is bytes:  # a coded index (columns-2), as compact.positions gives it
        return index
    # from a list of ints, value for value (bytes() of another buffer, an array, would copy its raw memory)
    return bytes(index if type(index) is list else list(index))


def _where(col: Column | None, n: int, pred: Callable[[Any], bool]) -> list[int]:
    """Positions of the entries whose value satisfies ``pred`` (a table column: tested once per table value)."""
    if col is None:
        return list(range(n)) if pred(None) else []
    if type(col) is _Table:
        hit = [bool(pred(v)) for v in col.table]
        if not any(hit):
            return []
        if all(hit):
            return list(range(n))
        codes = _codes(col.index, len(col.table))
        if codes is None:
            return list(compress(range(n), map(hit.__getitem__, col.index)))
        mask = codes.translate(bytes(hit).ljust(256, b"\0"))
        if mask.count(1) * 16 > n:
            return list(compress(range(n), mask))
        out, i = [], mask.find(1)  # a few (a dump's last ops): found by a scan in C each
        while i >= 0:
            out.append(i)
            i = mask.find(1, i + 1)
        return out
    return list(compress(range(n), map(pred, _values(col, n))))


def _summarize(obj: dict[str, Any], cols: dict[str, Column], path: str,
               rank_hint: int | None) -> RankSummary:
    n = obj["entries"]["count"]
    pgc, prof = cols.get("process_group"), cols.get("profiling_name")
    sig_cols = [cols.get(k) for k in SIG_KEYS]
    if type(pgc) is not _Table or not all(c is None or type(c) is _Table for c in sig_cols) or prof is None:
        raise _Fallback
    # every group named as frnccl and torch do, (name, desc); every entry has a profiling_name
    if not all(type(v) is list and len(v) == 2 and type(v[0]) is str and type(v[1]) is str for v in pgc.table):
        raise _Fallback
    if None in prof.table:
        raise _Fallback
    # A signature's sizes and dtypes are their text, and the row path gives a run of equal rows the first one's:
    # values equal but written differently ([[4]], [[4.0]], [[true]], dicts in another order) would get one Sig
    # there and one per table value here. Sizes are ints and dtypes strings; anything else is the row path's.
    if not all(c is None or all(map(_plain, c.table)) for c in sig_cols):
        raise _Fallback
    bounds.normalize(obj)  # as load_dump does (it changes no entry; doing it twice changes nothing more)
    h = Header(obj, path, rank_hint, n)
    s, pgs = h.s, h.pgs

    # entries per group, as reduce.summarize_rows groups them (first-appearance order, equal names as one): one
    # byte per entry says its group, a group's entries are picked in C by a mask of its bytes
    canon: dict[tuple[str, str], int] = {}
    dense = [canon.setdefault((v[0], v[1]), len(canon)) for v in pgc.table]
    if len(canon) > 256:
        raise _Fallback
    reps: dict[int, list[str]] = {}  # code -> its first table value
    for v, c in zip(pgc.table, dense):
        reps.setdefault(c, v)
    same = len(canon) == len(dense)  # no two table values name the same group: the index is the code
    codes = _codes(pgc.index if same else list(map(dense.__getitem__, pgc.index)), 256) or b""
    firsts = sorted((p, c) for c in range(len(canon)) if (p := codes.find(c)) >= 0)
    pg_ids = cols.get("pg_id")
    merged: dict[str, list[int]] = {}  # group name -> its codes
    pg_id_to_name: dict[str, str] = {}
    rp_of: dict[int, RankPg] = {}
    for p, c in firsts:
        v = reps[c]
        rp = rp_of[c] = h.pg_for(v[0], v[1])
        if pg_ids is not None and (pid := _one(pg_ids, p)) is not None:
            pg_id_to_name.setdefault(str(pid), rp.name)
        merged.setdefault(rp.name, []).append(c)
    last_rp = rp_of[codes[-1]]

    with_status = h.status(pg_id_to_name)
    flags = _values(cols.get("is_p2p"), n)
    if flags.count(False) != n and (None in flags or any(flags)):  # (all False: the count, by identity, in C)
        raise _Fallback  # p2p ops, torch's dumps without is_p2p: the row path
    truncated = as_int(_one(cols.get("record_id"), 0), 0) > 0
    # entries retired without completing (frnccl: failed; torch's gloo: states never updated): few, found once
    retired = cols.get("retired")
    not_done = _where(cols.get("state"), n, _not_completed)  # a dump's last few ops, mostly
    unfinished = [p for p in not_done if _one(retired, p) is True]
    sig_ids: dict[Sig, int] = {}
    row_cols = [cols.get(k) for k in ROW_KEYS]
    sig_index = _sig_index(sig_cols)
    states = _state_codes(row_cols[2])
    # GPU start and end (_ROW_KEYS 6 and 9) equal to the discovered start and completion (4 and 5), value for value
    same_as = [False] * len(ROW_KEYS)
    for k, other in ((6, 4), (9, 5)):
        a, b = row_cols[k], row_cols[other]
        same_as[k] = a is not None and (a is b or (type(a) is list and type(b) is list and a == b))
    for name, rp in pgs.items():
        got = merged.get(name)
        if not got:
            empty: list[Any] = [() for _ in ROW_KEYS]
            coll_columns(rp, [], empty, None, truncated, h.fmt, h.offset, sig_ids)
            p2p_ops(rp, [], None, truncated, h.fmt, h.offset)
            mark_failed(s, rp, empty, h.fmt, name in with_status)
            continue
        mask: bytes | None = None
        m = n
        if len(got) < len(firsts):
            on = bytearray(256)
            for c in got:
                on[c] = 1
            mask = codes.translate(on)
            m = mask.count(1)
        seqs = _take(row_cols[1], mask, n, m)
        seq_col = _seq_column(seqs)
        if seq_col is None:
            raise _Fallback  # coalesced groups (a seq shared by several entries): the row path
        _coll(rp, row_cols, seqs, seq_col, mask, n, m, mask is None or mask[0] == 1, truncated, h, states, not_done,
              same_as, sig_index, sig_ids)
        p2p_ops(rp, [], None, truncated, h.fmt, h.offset)
        mine = unfinished if mask is None else [p for p in unfinished if mask[p]]
        if mine:
            if h.fmt == "frnccl":  # retired and not completed: the op failed
                rp.failed.update(q for q in map(as_int, (_one(row_cols[1], p) for p in mine)) if q > rp.dropped_coll)
            elif any(_one(row_cols[2], p) == "scheduled" for p in mine):
                untrusted_states(s, rp, name in with_status)

    newest = list(range(max(0, n - FRAMES_KEPT), n))
    got_newest = [_at(cols.get(k), newest, -1) for k in _NEWEST_KEYS]
    rows = [{k: v for k, v in zip(_NEWEST_KEYS, vs) if v is not None} for vs in zip(*got_newest)]
    h.finish(rows, last_rp)
    return s


def _not_completed(v: Any) -> bool:
    return v != "completed"


def _state_codes(col: Column | None) -> bytes | None:
    """Every entry's state code (fields.state_codes), worked out once per table value; None unless table-coded."""
    if type(col) is not _Table:
        return None
    codes = _codes(col.index, len(col.table))
    return None if codes is None else codes.translate(bytes(map(state_code, col.table)).ljust(256, b"\0"))


def _group_states(states: bytes, not_done: list[int], mask: bytes | None, m: int) -> bytes:
    """The state codes of a group's ``m`` entries (``mask``): all COMPLETED but at the group's entries among
    ``not_done`` (the entries not 'completed', the only ones whose code is another), when those are few."""
    if mask is None:
        return states
    if len(not_done) > 32:  # (each one costs about what compress takes for 64 entries)
        return bytes(compress(states, mask))
    out = bytearray((COMPLETED,)) * m
    for p in not_done:
        if mask[p]:
            out[mask.count(1, 0, p)] = states[p]
    return bytes(out)


def _coll(rp: RankPg, row_cols: list[Column | None], seqs: list[Any], seq_col: array | range,
          mask: bytes | None, n: int, m: int, first_in_lo: bool, truncated: bool, h: Header, states: bytes | None,
          not_done: list[int], same_as: list[bool], sig_index: tuple[Any, ...], sig_ids: dict[Sig, int]) -> None:
    """reduce.coll_columns for one group's entries (``mask``), seqs contiguous: the same columns."""
    fmt, offset = h.fmt, h.offset
    lo, hi = seqs[0], seqs[-1]
    if rp.dropped_coll == -2 or (rp.dropped_coll == -1 and fmt == "torch"):
        rp.dropped_coll = infer_dropped(lo, first_in_lo, rp.last_enqueued_coll, truncated)
    dropped = rp.dropped_coll
    rp.last_enqueued_coll = max(rp.last_enqueued_coll, hi, dropped)
    start = max(0, dropped + 1 - lo)
    if start >= m:
        return
    rp.c_seq = seq_col[start:] if start else seq_col
    if type(seq_col) is range:
        rp.c_seq = array("q", rp.c_seq)
    rp.c_sig = _sig_column(sig_index, mask, start, sig_ids, rp.sigs)
    if states is not None:
        rp.c_state = _group_states(states, not_done, mask, m)[start:]
    else:
        rp.c_state = state_codes(_take(row_cols[2], mask, n, m)[start:])

    def times(k: int, offset: int = offset) -> tuple[array, list[Any] | None]:
        """The column's int64s; its values when that is what they are (offset 0), to find zeros in."""
        vals = _take(row_cols[k], mask, n, m)
        if start:
            vals = vals[start:]
        got = _int64(vals, offset)
        return (got, vals) if got is not None else (times_column(vals, offset), None)

    created, _ = times(3)
    rp.c_created = created
    rp.c_started, started = times(4)
    rp.c_completed, completed = times(5)
    # the GPU times are often the discovered ones (same values): then their columns are copies of those
    gpu_end, vals = (array("q", rp.c_completed), completed) if same_as[9] and completed is not None else times(9)
    rp.c_end = _or_else(gpu_end, vals, rp.c_completed)
    gpu, vals = (array("q", rp.c_started), started) if same_as[6] and started is not None else times(6)
    rp.c_arrive = _or_else(gpu, vals, created, array("q", created))
    rp.c_record, _ = times(7, 0)


def _or_else(col: array, vals: list[Any] | None, other: array, none: array | None = None) -> array:
    """As reduce.coll_columns chooses: ``none`` (else ``other``) when ``col`` is all 0 (unknown), ``col`` when
    no value is 0, else ``col`` with ``other``'s values where it has 0 (found in ``vals``, col's values, when
    given)."""
    if not any(col):
        return other if none is None else none
    if vals is None:
        return col if 0 not in col else or_else(col, other)
    i = -1
    try:
        i = vals.index(0)
    except ValueError:
        return col
    out = array("q", col)
    try:
        while True:
            out[i] = other[i]
            i = vals.index(0, i + 1)
    except ValueError:
        return out


_SEQS: dict[tuple[int, int], array] = {}  # (first seq, count) -> its contiguous seqs: alike in every dump of a job
_SEQS_KEPT = 64


def _seq_column(seqs: list[Any]) -> array | range | None:
    """A group's seqs as they are kept (reduce.coll_columns: contiguous, one entry per seq, the first and last
    ints; equal values the same array), or None if they are not so."""
    n = len(seqs)
    got = _int64(seqs, 0)
    if got is None:  # not all int64s: equal to a range anyway?
        return range(seqs[0], seqs[-1] + 1) if contiguous(seqs) else None
    lo = seqs[0]
    if not (type(lo) is int and type(seqs[-1]) is int and seqs[-1] - lo == n - 1):
        return None
    want = _SEQS.get((lo, n))
    if want is None:
        if len(_SEQS) >= _SEQS_KEPT:
            _SEQS.clear()
        want = _SEQS[(lo, n)] = array("q", range(lo, lo + n))
    return got if got == want else None


def _int64(vals: list[Any], offset: int) -> array | None:
    """fields.times_column(vals, offset) where every value is an int64 and offset 0 (packed in C); else None."""
    if offset:
        return None
    packer = _PACKERS.get(len(vals))
    if packer is None:
        if len(_PACKERS) >= _PACKERS_KEPT:
            _PACKERS.clear()
        packer = _PACKERS[len(vals)] = struct.Struct(f"{len(vals)}q").pack
    try:
        return array("q", packer(*vals))
    except struct.error:  # not all int64s: fields.times_column says what each is
        return None


_PACKERS: dict[int, Callable[..., bytes]] = {}  # count -> packer of that many int64s (a group's size, alike per job)
_PACKERS_KEPT = 64


def _plain(v: Any) -> bool:
    """Whether ``v`` is made of ints (not bools), strings, None and lists only: values whose == is their text's."""
    t = type(v)
    if t is int or t is str or v is None:
        return True
    return t is list and all(map(_plain, v))


def _sig_index(sig_cols: list[_Table | None]) -> tuple[Any, ...]:
    """(the signature columns present as (key, column), their distinct index lists, which list each uses): the
    columns of one op's signature are often coded alike, then one list says every entry's combination."""
    present = [(k, c) for k, c in zip(SIG_KEYS, sig_cols) if c is not None]
    uniq: list[list[int]] = []
    which: list[int] = []
    for _, c in present:
        for j, u in enumerate(uniq):
            if c.index is u or c.index == u:
                which.append(j)
                break
        else:
            which.append(len(uniq))
            uniq.append(c.index)
    return present, uniq, which


def _sig_column(sig_index: tuple[Any, ...], mask: bytes | None, start: int, sig_ids: dict[Sig, int],
                table: list[Sig]) -> array:
    """One Sig id per entry of ``mask`` from ``start`` on: the Sig is worked out once per distinct combination
    of table values, and the ids are given in order of first appearance (as reduce._sig_column gives them)."""
    present, uniq, which = sig_index
    subs = [u if mask is None else list(compress(u, mask)) for u in uniq]
    if start:
        subs = [u[start:] for u in subs]
    keys: list[Any] = subs[0] if len(subs) == 1 else list(zip(*subs))
    sid_of: dict[Any, int] = {}
    for key in dict.fromkeys(keys):
        combo = [key] * len(which) if len(subs) == 1 else [key[j] for j in which]
        e = {k: v for (k, c), i in zip(present, combo) if (v := c.table[i]) is not None}
        sig = single_sig(e)
        sid = sig_ids.get(sig)
        if sid is None:
            sid = sig_ids[sig] = len(table)
            table.append(sig)
        sid_of[key] = sid
    if len(sid_of) == 1:
        return array("i", sid_of.values()) * len(keys)
    return array("i", map(sid_of.__getitem__, keys))
