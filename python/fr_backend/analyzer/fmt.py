"""Small text helpers shared by the reports."""

from __future__ import annotations

import re
from typing import Iterable


def ranks_str(ranks: Iterable[int], limit: int = 12) -> str:
    """[0,1,2,5,7,8,9] -> '0-2,5,7-9' (runs collapsed, long lists cut)."""
    rs = sorted(set(ranks))
    if not rs:
        return "none"
    runs: list[str] = []
    start = prev = rs[0]
    for r in rs[1:] + [None]:  # type: ignore[list-item]
        if r is not None and r == prev + 1:
            prev = r
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    if len(runs) > limit:
        return ",".join(runs[:limit]) + f",... ({len(rs)} ranks)"
    return ",".join(runs)


def rank_word(ranks: Iterable[int]) -> str:
    rs = sorted(set(ranks))
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {ranks_str(rs)}"


def ms(ns: float) -> str:
    v = ns / 1e6
    return f"{v:.1f} ms" if v < 10_000 else f"{v / 1000:.1f} s"


def sizes_str(key: str) -> str:
    """'[[4, 4]]>[[4, 4]]' -> 'in [[4, 4]] out [[4, 4]]'; groups joined by '|'."""
    parts = []
    for k in key.split("|"):
        if ">" in k:
            i, o = k.split(">", 1)
            bits = ([f"in {i}"] if i else []) + ([f"out {o}"] if o else [])
            parts.append(" ".join(bits))
        else:
            parts.append(k)
    return "; ".join(p for p in parts if p) or "(no sizes)"


# What a terminal acts on rather than shows: C0 and C1 controls (ESC starts a sequence that can
# clear the screen or move the cursor, CR returns to the start of the line), DEL, and the Unicode
# line separators and bidirectional overrides that reorder what is shown.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escaped(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def clean(s: str) -> str:
    """Text from a dump or a store, fit for one line of a terminal or a text report: every control
    character is written as its escape (ESC as \\x1b, a newline as \\x0a), the rest is kept."""
    return _CONTROL.sub(_escaped, s) if _CONTROL.search(s) else s
