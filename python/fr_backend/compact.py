"""The compact dump encoding: gzip'ed JSON with the entries stored as columns.

A compact dump (``<incident>/compact/frnccl_rank_<R>.json.gz``) is a gzip stream (RFC 1952, so
``zcat`` reads it) of one UTF-8 JSON object. It holds every top-level and header key of the row
form (docs/dump-format.md) unchanged, plus ``"encoding": "columns-2"``, except ``entries``::

    "entries": {"count": N, "columns": {"<entry key>": COLUMN, ...}}

Each COLUMN describes the N values of one entry key, oldest entry first, in one of four forms:

- ``[v0, v1, ...]``: the values as they are; ``null`` where an entry lacks the key.
- ``{"delta": D}``: integers, v0 = d0 and vi = v(i-1) + di (counters, creation times);
  ``{"delta": D, "start": S}``: the same with v0 = S + d0.
- ``{"offset_from": "<key>", "values": O}``: integers, vi = <key>[i] + oi, and vi = 0 (a time
  not seen) where oi is null: the other timestamps of an entry, relative to its creation.
- ``{"table": [t0, t1, ...], "index": I}``: vi = table[ii], each distinct value once
  (op names, shapes, dtypes, group names, caller stacks).

D and O are either a JSON list of integers (O: or null) or a string of W hexadecimal digits per
value, W = 2, 4, 8 or 16 (the string's length over N), each value a W-digit two's-complement
integer, most significant digit first; in O the most negative W-digit value (``80``, ``8000``...)
stands for null. I is either a JSON list of positions or a string of one character per entry, the
position's character in :data:`CODE_ALPHABET` (for a table of at most 64 values). The strings are
what frnccl writes, each column as narrow as its values allow: a reader turns them into numbers in
C (``bytes.fromhex``, ``array``, ``bytes.translate``), where a JSON list costs a Python object per
number first. ``"columns-1"`` files (written with lists only, no start) are read alike.

Which form a key gets is the writer's choice; a reader handles all four for any key. A
reader refuses a delta or offset column that holds anything but integers, and a nonzero count
without a column (entries always have keys; nothing in such a file would pay for its rows). Entries
that are far apart in a ring buffer of 20,000 compress to about 10-40 bytes each this way,
because zlib's 32 KiB window never sees the repeats of a row form that far apart.

Files come from other machines, so :func:`decode` bounds what it inflates and what the entries
would unfold to, and checks the structure (lengths, indexes, kinds of columns) before anything
uses it; a file that breaks a rule raises :class:`DumpError` with one line. JSON cannot share
objects, so the parsed tree is linear in the inflated text; only table references share, and
their unfolded size is computed from the table before any row is built.
"""

from __future__ import annotations

import gzip
import json
import sys
import zlib
from array import array
from itertools import accumulate
from typing import Any

from .analyzer.model import DumpError, first_line

ENCODING = "columns-2"  # what frnccl writes
ENCODINGS = ("columns-1", ENCODING)  # what it reads: columns-1 has the list forms only
GZIP_MAGIC = b"\x1f\x8b"

# An inflated dump may not exceed this (a 1 MB gzip bomb inflates to 1 GB).
MAX_INFLATED_BYTES = 1 << 30
# What the rows of a dump may unfold to when table values are copied out, at most this many times
# the inflated text plus a floor: a row-form reader (json.dumps, ==, a report) walks shared values
# as a tree, and one table value of 1 MB referenced by a million entries would be a terabyte.
UNFOLD_FACTOR = 64
UNFOLD_FLOOR = 256 << 20

# Keys whose integer values rise from entry to entry: stored as deltas.
_DELTA_KEYS = ("record_id", "collective_seq_id", "p2p_seq_id", "op_id", "time_created_ns")
# Timestamps stored relative to the entry's creation (0: not seen).
_OFFSET_BASE = "time_created_ns"
_OFFSET_KEYS = ("time_discovered_started_ns", "time_discovered_completed_ns", "time_gpu_started_ns",
                "time_gpu_completed_ns")
# Keys whose values are as distinct as the entries: kept as they are.
_PLAIN_KEYS = ("duration_ms", "is_p2p", "retired")

# Packed columns: hex digits per value -> the array type of that many bytes (4 bits a digit).
_TYPECODES = {2: "b", 4: "h", 8: next(c for c in "il" if array(c).itemsize == 4), 16: "q"}
# Table positions as one character each, for tables of up to 64 values.
CODE_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_"
_POSITION_OF = bytes(CODE_ALPHABET.find(chr(c)) % 256 for c in range(256))  # 255: no position
_POSITIONS = bytes(range(len(CODE_ALPHABET)))
_BIG_ENDIAN = sys.byteorder == "big"


def is_compact(data: bytes) -> bool:
    return data[:2] == GZIP_MAGIC


# --------------------------------------------------------------------------- writing


def encode(dump: dict[str, Any], level: int = 6) -> bytes:
    """The compact encoding of a row-form dump dict (as ``load_dump`` returns, or a synthetic one)."""
    return gzip.compress(encode_json(dump).encode(), compresslevel=level, mtime=0)


def encode_json(dump: dict[str, Any]) -> str:
    out = {k: v for k, v in dump.items() if k != "entries"}
    out["encoding"] = ENCODING
    entries = dump.get("entries") or []
    keys: dict[str, None] = {}
    for e in entries:
        keys.update(dict.fromkeys(e))
    columns: dict[str, Any] = {}
    for key in keys:
        vals = [e.get(key) for e in entries]
        columns[key] = _encode_column(key, vals, entries)
    out["entries"] = {"count": len(entries), "columns": columns}
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


def _all_ints(vals: list[Any]) -> bool:
    return all(type(v) is int for v in vals)


def null_of(packed: array) -> int:
    """The value that stands for null in a packed offset column: the most negative of its width."""
    return -(1 << (8 * packed.itemsize - 1))


def _hex(vals: list[int], nulls: bool = False) -> str | None:
    """The packed form of integers, as few digits each as they all fit in; with ``nulls``, None stands for null
    (then no value may be the width's most negative one). None if a value does not fit in 64 bits."""
    present = [v for v in vals if v is not None]
    lo, hi = (min(present), max(present)) if present else (0, 0)
    for digits, code in _TYPECODES.items():
        top = 1 << (4 * digits - 1)
        if -top + nulls <= lo and hi < top:
            a = array(code, [-top if v is None else v for v in vals] if nulls else vals)
            if not _BIG_ENDIAN:
                a.byteswap()
            return a.tobytes().hex()
    return None


def _encode_column(key: str, vals: list[Any], entries: list[dict[str, Any]]) -> Any:
    if key in _DELTA_KEYS and _all_ints(vals):
        d = [b - a for a, b in zip(vals, vals[1:])]
        packed = _hex([0] + d) if vals else None
        if packed is None:  # past 64 bits: a list, starting from 0
            return {"delta": [b - a for a, b in zip([0] + vals, vals)]}
        return {"delta": packed, "start": vals[0]}
    if key in _OFFSET_KEYS and _all_ints(vals):
        base = [e.get(_OFFSET_BASE) for e in entries]
        if _all_ints(base):
            offs = [v - b if v else None for v, b in zip(vals, base)]
            packed = _hex(offs, nulls=True)
            return {"offset_from": _OFFSET_BASE, "values": offs if packed is None else packed}
    if key in _PLAIN_KEYS:
        return vals
    table: list[Any] = []
    seen: dict[Any, int] = {}
    index = []
    for v in vals:
        k = v if type(v) is str else (repr(v),)  # lists and dicts are not hashable; their text is
        i = seen.get(k)
        if i is None:
            i = seen[k] = len(table)
            table.append(v)
        index.append(i)
    if len(table) <= len(CODE_ALPHABET):
        return {"table": table, "index": "".join(map(CODE_ALPHABET.__getitem__, index))}
    return {"table": table, "index": index}


# --------------------------------------------------------------------------- reading


def inflate(data: bytes) -> bytes:
    """The inflated bytes of a gzip stream, refused past MAX_INFLATED_BYTES or when damaged."""
    d = zlib.decompressobj(wbits=31)
    try:
        out = d.decompress(data, MAX_INFLATED_BYTES + 1)
        if len(out) > MAX_INFLATED_BYTES:
            raise DumpError(f"refused: inflates to more than {MAX_INFLATED_BYTES} bytes")
        if not d.eof:
            raise DumpError("corrupt or truncated gzip (the stream does not end)")
    except zlib.error as exc:
        raise DumpError(f"corrupt or truncated gzip ({exc})") from None
    return out


def parse(data: bytes) -> dict[str, Any]:
    """The JSON object of a compact (or any gzip'ed JSON) dump, entries not yet expanded."""
    text = inflate(data)
    try:
        # UTF-8, as written: json.loads of bytes would also take UTF-16 and UTF-32 (and import their codecs)
        obj = json.loads(text.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError) as exc:  # MemoryError: the caller bounds memory, and says so
        raise DumpError(f"corrupt or truncated JSON in gzip ({first_line(exc)})") from None
    if not isinstance(obj, dict):
        raise DumpError(f"not a flight-recorder dump (top level is {type(obj).__name__}, not dict)")
    obj["_inflated_bytes"] = len(text)
    return obj


def columns(obj: dict[str, Any]) -> tuple[int, dict[str, list[Any]]]:
    """(count, key -> its N values) of a parsed columns-1 or columns-2 dump. Table-coded values are
    shared, not copied: equal values of one column are the same object."""
    ents = obj.get("entries")
    if not isinstance(ents, dict):
        raise DumpError("malformed compact dump (entries is not an object)")
    n = ents.get("count")
    cols = ents.get("columns")
    if type(n) is not int or n < 0 or not isinstance(cols, dict):
        raise DumpError("malformed compact dump (entries needs an integer count and a columns object)")
    if n and not cols:
        # A column pays for its rows with at least a byte each; without one, a 100-byte file could ask for 10**12.
        raise DumpError(f"malformed compact dump (a count of {n} entries but no columns)")
    out: dict[str, list[Any]] = {}
    pending: list[tuple[str, dict[str, Any]]] = []
    for key, col in cols.items():
        if isinstance(col, dict) and "offset_from" in col:
            pending.append((key, col))  # needs its base column first
        else:
            out[key] = _column(key, col, n)
    for key, col in pending:
        base_key = col.get("offset_from")
        base = out.get(base_key) if isinstance(base_key, str) else None
        offs = col.get("values")
        if type(offs) is str:
            packed = packed_ints(offs, n, key)
            null = null_of(packed)
            offs = [None if o == null else o for o in packed]
        if base is None or not isinstance(offs, list) or len(offs) != n:
            raise DumpError(f"malformed compact dump (column {_shown(key)}: offset from a missing column "
                            "or of the wrong length)")
        # Integers only: `+` of strings or lists would concatenate (a copy of the base per entry).
        if not (_ints(base) and all(o is None or type(o) is int for o in offs)):
            raise DumpError(f"malformed compact dump (column {_shown(key)}: offsets or their base are not "
                            "integers)")
        out[key] = [0 if o is None else b + o for b, o in zip(base, offs)]
    return n, out


def packed_ints(text: str, n: int, key: Any) -> array:
    """The ``n`` integers of a packed (hex) delta or offset column."""
    digits = len(text) // n if n else 2
    code = _TYPECODES.get(digits)
    if code is None or len(text) != digits * n:
        each = "" if n else " (none for no entries)"
        raise DumpError(f"malformed compact dump (column {_shown(key)} has {len(text)} hex digits for {n} entries, "
                        f"not 2, 4, 8 or 16 each{each})")
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) * 2 != len(text):  # fromhex skips whitespace: a digit short of the width somewhere
        raise DumpError(f"malformed compact dump (column {_shown(key)}: not hexadecimal digits only)")
    a = array(code)
    a.frombytes(raw)
    if not _BIG_ENDIAN:
        a.byteswap()
    return a


def delta_start(col: dict[str, Any], key: Any) -> int:
    """A delta column's start (0 when absent)."""
    start = col.get("start", 0)
    if type(start) is not int:
        raise DumpError(f"malformed compact dump (column {_shown(key)}: start is not an integer)")
    return start


def positions(text: str, table_size: int, n: int, key: Any) -> bytes:
    """The ``n`` table positions of a coded index string (a byte each)."""
    if len(text) != n:
        raise DumpError(f"malformed compact dump (column {_shown(key)} has {len(text)} index characters for "
                        f"{n} entries)")
    if not text.isascii():
        raise DumpError(f"malformed compact dump (column {_shown(key)}: an index character is not in the code "
                        "alphabet)")
    pos = text.encode("ascii").translate(_POSITION_OF)
    if pos.translate(None, _POSITIONS[:min(table_size, len(CODE_ALPHABET))]):  # what is left is no position
        raise DumpError(f"malformed compact dump (column {_shown(key)}: an index is not a position in its table)")
    return pos


def _ints(vals: list[Any]) -> bool:
    return all(type(v) is int for v in vals)


def _column(key: str, col: Any, n: int) -> list[Any]:
    if isinstance(col, list):
        vals = col
    elif isinstance(col, dict) and "delta" in col:
        d = col["delta"]
        if type(d) is str:
            d = packed_ints(d, n, key)
        elif not isinstance(d, list):
            raise DumpError(f"malformed compact dump (column {_shown(key)}: delta is not a list or hex digits)")
        # Integers only: accumulate() would concatenate strings or lists, N deltas of L bytes into N*N*L/2.
        elif not _ints(d):
            raise DumpError(f"malformed compact dump (column {_shown(key)}: deltas are not integers)")
        vals = list(accumulate(d, initial=delta_start(col, key)))
        del vals[0]
    elif isinstance(col, dict) and "table" in col:
        table, index = col["table"], col.get("index")
        if not isinstance(table, list) or not isinstance(index, (list, str)):
            raise DumpError(f"malformed compact dump (column {_shown(key)}: table must be a list, index a list "
                            "or a string)")
        if type(index) is str:
            index = positions(index, len(table), n, key)
        elif index:
            try:
                ok = type(min(index)) is int and min(index) >= 0 and max(index) < len(table)
            except TypeError:
                ok = False
            if not ok or not all(type(i) is int for i in index):
                raise DumpError(f"malformed compact dump (column {_shown(key)}: an index is not a position in "
                                "its table)")
        vals = [table[i] for i in index]
    else:
        raise DumpError(f"malformed compact dump (column {_shown(key)} is of no known form)")
    if len(vals) != n:
        raise DumpError(f"malformed compact dump (column {_shown(key)} has {len(vals)} values for {n} entries)")
    return vals


# What one decoded integer costs, beyond its digits: its list slot and object header.
_INT_BYTES = 8 + 28
# What one row costs per column it may hold: its share of the row dict.
_ROW_BYTES_PER_KEY = 32
_ROW_BYTES = 64


def _int_bytes(bits: int) -> int:
    """What one decoded integer of up to ``bits`` bits costs, in memory or as JSON text (whichever is more)."""
    return _INT_BYTES + max(4 * (bits // 30 + 1), bits * 30103 // 100000 + 2)


def _most_bits(vals: Any, n: int, key: Any) -> int:
    """The largest bit length among the integers of a delta or offset column's values (a list, or a
    packed string: 4 bits a digit); 0 where the values are not integers (columns() refuses those)."""
    if type(vals) is str:
        return 4 * (len(vals) // n) if n else 0
    if not isinstance(vals, list):
        return 0
    try:
        return max(map(int.bit_length, (v for v in vals if v is not None)), default=0)
    except TypeError:
        return 0


def integer_bytes(cols: dict[str, Any], n: int) -> int:
    """What the decoded integers of the delta and offset columns take: each of the n values of a column
    is a new integer as large as its column's largest (a delta list of small numbers after a start of
    4,300 digits is n integers of 4,300 digits each)."""

    def bits_of(key: Any) -> int:
        col = cols.get(key) if isinstance(key, str) else None
        if isinstance(col, dict) and "delta" in col:
            start = col.get("start", 0)
            start_bits = start.bit_length() if type(start) is int else 0
            # the running sum of n values is at most n times the largest: log2(n) more bits
            return max(start_bits, _most_bits(col["delta"], n, key)) + max(n, 1).bit_length()
        if isinstance(col, list):
            return _most_bits(col, n, key)
        if isinstance(col, dict) and isinstance(col.get("table"), list):
            return _most_bits([v for v in col["table"] if type(v) is int], n, key)
        return 0

    total = 0
    for key, col in cols.items():
        if isinstance(col, dict) and "offset_from" in col:
            total += n * _int_bytes(max(bits_of(col["offset_from"]), _most_bits(col.get("values"), n, key)) + 1)
        elif isinstance(col, dict) and "delta" in col:
            total += n * _int_bytes(bits_of(key))
    return total


def unfolded_bytes(obj: dict[str, Any]) -> int:
    """About how many bytes the rows of a parsed compact dump would take: the text, one dict per entry,
    the integers the delta and offset columns decode to, and every table value written out where it is
    referenced (what a reader walking the rows as a tree sees). Every kind of column is counted: what
    the file's few bytes stand for is known here, before any of it is built."""
    total = obj.get("_inflated_bytes", 0)
    cols = obj.get("entries", {}).get("columns", {}) if isinstance(obj.get("entries"), dict) else {}
    if not isinstance(cols, dict) or not cols:  # no entries key at all included: nothing unfolds
        return total
    n = obj["entries"].get("count")
    if type(n) is int and n > 0 and cols:  # a count without columns is columns()'s to refuse, in its words
        total += n * (_ROW_BYTES + _ROW_BYTES_PER_KEY * len(cols)) + integer_bytes(cols, n)
    for col in cols.values():
        if not (isinstance(col, dict) and isinstance(col.get("table"), list)
                and isinstance(col.get("index"), (list, str))):
            continue
        table, index = col["table"], col["index"]
        sizes = [len(json.dumps(v, separators=(",", ":"))) for v in table]
        if type(index) is str:
            # a coded index names at most 64 values: count each in C; a bad character is columns()'s to refuse
            pos = index.encode("ascii", "replace").translate(_POSITION_OF) if index.isascii() else b""
            total += sum(s * pos.count(i) for i, s in enumerate(sizes[:len(CODE_ALPHABET)]))
            continue
        counts = [0] * len(table)
        for i in index:
            if type(i) is int and 0 <= i < len(counts):
                counts[i] += 1
        total += sum(s * c for s, c in zip(sizes, counts))
    return total


def to_rows(obj: dict[str, Any]) -> dict[str, Any]:
    """The row form (``entries`` a list of dicts, as the pickle and JSON formats hold) of a parsed
    dump; a row-form dump is returned as it is. Each entry lacks the keys whose value is null."""
    if obj.get("encoding") not in ENCODINGS:
        obj.pop("_inflated_bytes", None)
        return obj
    limit = UNFOLD_FLOOR + UNFOLD_FACTOR * obj.get("_inflated_bytes", 0)
    size = unfolded_bytes(obj)
    if size > limit:
        raise DumpError(f"refused: its entries unfold to about {size} bytes (limit {limit})")
    n, cols = columns(obj)
    keys = list(cols)
    rows = []
    for vals in zip(*(cols[k] for k in keys)) if keys else ((),) * n:
        rows.append({k: v for k, v in zip(keys, vals) if v is not None})
    out = {k: v for k, v in obj.items() if k not in ("entries", "encoding", "_inflated_bytes")}
    out["entries"] = rows
    return out


def decode(data: bytes) -> dict[str, Any]:
    """A compact (or gzip'ed row-form JSON) dump file's bytes -> the row-form dump dict."""
    return to_rows(parse(data))


def _shown(k: Any) -> str:
    s = str(k)[:40]
    return "".join(c if c.isprintable() else "?" for c in s)
