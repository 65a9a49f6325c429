"""What one entry's fields become in a summary, shared by both readers of entries (reduce.py's rows,
columnar.py's columns): ints, times and states checked and packed, an op's name split once, and its
signature (name, sizes, dtypes) as the matcher compares it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import compress, repeat
from operator import not_
from typing import Any

from .model import COMPLETED, SCHEDULED, STARTED, Sig
from .ops import family, is_marker, split_name

STATE_CODES = {"scheduled": SCHEDULED, "started": STARTED, "completed": COMPLETED}

# Ranks at or above this are taken for corruption: the world size bounds loops and lists of ranks.
MAX_RANKS = 1 << 20

_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
SIG_KEYS = ("profiling_name", "input_sizes", "output_sizes", "input_dtypes", "output_dtypes")

# per entry, in one pass: is_p2p, then what a collective's columns are made of, then retired, then the GPU end
ROW_KEYS = ("is_p2p", "collective_seq_id", "state", "time_created_ns", "time_discovered_started_ns",
             "time_discovered_completed_ns", "time_gpu_started_ns", "record_id", "retired", "time_gpu_completed_ns")

# Per process (each loader worker has its own): op name -> info, interned strings. Bounded (CACHE_MAX), in
# case of hostile input.
_OPINFO: dict[str, tuple[str, str, bool, str]] = {}
_STRINGS: dict[str, str] = {}
CACHE_MAX = 1 << 16


def as_int(v: Any, default: int = 0) -> int:
    if type(v) is int:
        return v
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return default


def as_i64(v: Any) -> int:
    v = as_int(v)
    return v if _I64_MIN <= v <= _I64_MAX else 0


def as_ns(v: Any, offset: int) -> int:
    """A time (or id) as int64: 0 when unknown or not a number; corrected by the clock offset."""
    v = as_i64(v)
    if not v:
        return 0
    v -= offset
    return v if _I64_MIN <= v <= _I64_MAX else 0


def times_column(vals: Sequence[Any], offset: int) -> array:
    """int64 column of times (or ids) corrected by ``offset``; 0 where unknown or not a number."""
    try:
        if not offset:
            try:
                return array("q", vals)  # plain ints: straight into C
            except TypeError:  # None somewhere
                if vals.count(None) == len(vals):  # a time this writer leaves unset (torch's gloo)
                    return array("q", bytes(8 * len(vals)))
                return array("q", [x or 0 for x in vals])
        return array("q", [x - offset if x else 0 for x in vals])
    except (TypeError, OverflowError):
        return array("q", [as_ns(x, offset) for x in vals])


def or_else(col: array, other: array) -> array:
    """``col``, with ``other``'s value where col's is 0 (unknown): the zeros are few, found in C."""
    out = array("q", col)
    for i in compress(range(len(col)), map(not_, col)):
        out[i] = other[i]
    return out


def state_code(v: Any) -> int:
    return STATE_CODES.get(v, SCHEDULED) if type(v) is str else SCHEDULED


def state_codes(vals: Sequence[Any]) -> bytes:
    try:
        return bytes(map(STATE_CODES.get, vals, repeat(SCHEDULED)))
    except TypeError:
        return bytes(map(state_code, vals))


def contiguous(seqs: Sequence[Any]) -> bool:
    """Ascending, contiguous, one entry per seq: the usual shape, reduced column-wise."""
    n = len(seqs)
    return (n > 0 and type(seqs[0]) is int and type(seqs[-1]) is int and seqs[-1] - seqs[0] == n - 1
            and tuple(seqs) == tuple(range(seqs[0], seqs[0] + n)))


def infer_dropped(lo: int | None, first_in_lo: bool, last_enqueued: int, truncated: bool) -> int:
    """Torch dumps carry no last_dropped: history below the oldest seq kept is unknown; the oldest
    group of a cut buffer may have lost its first ops, so it counts as cut too."""
    if lo is None:
        return last_enqueued if truncated or last_enqueued > 0 else -1
    if truncated and first_in_lo:
        return lo
    return lo - 1 if lo > 1 else -1


def interned(v: str) -> str:
    """One object per distinct string (p2p records): kept once in memory and in the pickle to the parent."""
    got = _STRINGS.get(v)
    if got is None:
        if len(_STRINGS) >= CACHE_MAX:
            _STRINGS.clear()
        got = _STRINGS[v] = v
    return got


def opinfo(prof: Any) -> tuple[str, str, bool, str]:
    """profiling_name -> (op, meta, is_marker, op_family), cached."""
    info = _OPINFO.get(prof) if type(prof) is str else None
    if info is None:
        op, meta = split_name(prof)
        info = (op, meta, is_marker(op), family(op))
        if type(prof) is str:
            if len(_OPINFO) >= CACHE_MAX:
                _OPINFO.clear()
            _OPINFO[prof] = info
    return info


def single_sig(e: dict[str, Any]) -> Sig:
    op, _, _, fam = opinfo(e["profiling_name"])
    if fam == "none":
        return (op, op, "", "", 1)
    sk, dk = compare_keys(fam, e)
    return (op, op, sk, dk, 1)


def compare_keys(fam: str, e: dict[str, Any]) -> tuple[str, str]:
    """(sizes key, dtypes key) of one op: the sizes that must agree across ranks for its family."""
    if fam == "both":
        return f"{e.get('input_sizes')}>{e.get('output_sizes')}", dtype_key(e.get("input_dtypes"))
    if fam == "out":
        return f">{e.get('output_sizes')}", dtype_key(e.get("output_dtypes"))
    if fam == "in":
        return f"{e.get('input_sizes')}>", dtype_key(e.get("input_dtypes"))
    if fam == "dtype":  # all_to_all*, all_gather_v, reduce_scatter_v: sizes differ per rank, dtypes may not
        ins, outs = e.get("input_dtypes"), e.get("output_dtypes")
        if type(ins) is list and type(outs) is list:
            return "", dtype_key(ins + outs)
        return "", dtype_key(ins if ins else outs)
    return "", ""


def dtype_key(dts: Any) -> str:
    if type(dts) is list:
        if len(dts) == 1:
            return str(dts[0])
        return ",".join(sorted({str(x) for x in dts if x}))
    return str(dts) if dts else ""
