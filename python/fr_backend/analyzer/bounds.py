"""Bounds on what one dump file may hold once parsed, and the types of the header fields.

A pickle may reference one object many times (its memo, or DUP), so a 5 KB file can hold a
list that, followed as a tree (which is what ``str``, ``==``, ``hash``, ``marshal`` and every
report do), has 2**30 elements. The unpickler itself builds at most one object per opcode, so
what it builds stays linear in the file; what must be bounded is the tree as any reader sees it.

:func:`check` measures that tree by pickling it again with the memo off (``Pickler.fast``):
every shared reference is then written out in full, so the output is the size of the unfolded
tree. The C pickler hands its output to :class:`_Meter` every 64 KiB frame, which stops it as
soon as the tree outgrows the file; the work done is bounded by the limit, never by what the
file describes. Nesting is bounded by the interpreter's recursion limit (RecursionError), a
cycle by the pickler's own check. The cost is a C-speed pass, about half of unpickling.
"""

from __future__ import annotations

import pickle
from typing import Any

from .model import DumpError, first_line

# The unfolded tree may be this many times its file, plus a floor for small files. Plain dumps
# unfold to 2-15 times their pickle (strings the writer memoized, such as frame file names and
# dict keys, are written once and referenced by a 2-5 byte index); a memo bomb is stopped after
# 4 MiB + 32 bytes a byte of file, whatever it would unfold to.
UNFOLD_FACTOR = 32
UNFOLD_FLOOR = 4 << 20

_SCALARS = frozenset({int, float, bool, type(None)})

# Header fields shown to people: they must be text, and of a size a line can hold.
_TEXT_FIELDS = {"version": 64, "format": 64, "hostname": 256, "incident_id": 256, "dump_reason": 256,
                "dump_detail": 4096, "thread_stacks": 1 << 26}


class _TooLarge(Exception):
    pass


class _Meter:
    """A write-only file that counts what the pickler writes and stops it past ``limit``."""

    __slots__ = ("left",)

    def __init__(self, limit: int) -> None:
        self.left = limit

    def write(self, b: bytes) -> int:
        self.left -= len(b)
        if self.left < 0:
            raise _TooLarge
        return len(b)


def unfold_limit(nbytes: int) -> int:
    return UNFOLD_FLOOR + UNFOLD_FACTOR * nbytes


def check(obj: Any, nbytes: int) -> None:
    """Refuse (DumpError, one line) a parsed dump whose tree, followed reference by reference, outgrows
    its ``nbytes``-byte file, or nests deeper than the interpreter can follow."""
    limit = unfold_limit(nbytes)
    p = pickle.Pickler(_Meter(limit), protocol=4)  # protocol 4: frames, flushed to the meter every 64 KiB
    p.fast = True
    try:
        p.dump(obj)
    except _TooLarge:
        raise DumpError(f"refused: it unfolds to more than {limit} bytes of values for its {nbytes} bytes "
                        "(shared references nested in one another: a pickle bomb)") from None
    except RecursionError:
        raise DumpError("refused: values nested too deep") from None
    except ValueError as exc:  # fast mode's cycle check
        raise DumpError(f"refused: {first_line(exc, 60)}") from None
    except (pickle.PicklingError, TypeError) as exc:  # not plain data (cannot come from our unpickler)
        raise DumpError(f"refused: holds what is not plain data ({first_line(exc, 60)})") from None


def normalize(d: dict[str, Any]) -> None:
    """Header fields shown to people become text of a bounded length, whatever type the file gave:
    a number is written out, anything else (a list, a dict) is dropped."""
    for key, limit in _TEXT_FIELDS.items():
        if key not in d:
            continue
        v = d[key]
        if type(v) is not str:
            v = "" if v is None or type(v) not in _SCALARS else str(v)
        d[key] = v if len(v) <= limit else v[:limit] + "..."
    for table in ("pg_config", "pg_status"):
        groups = d.get(table)
        if type(groups) is not dict:
            continue
        for cfg in groups.values():
            if type(cfg) is not dict:
                continue
            for key in ("name", "desc", "process_group"):
                v = cfg.get(key)
                if v is not None and type(v) is not str:
                    cfg[key] = str(v) if type(v) in _SCALARS else ""
