"""Stragglers: ranks that reach a group's collectives late by their own doing, by a margin that the clocks'
uncertainty and the group's pace make material (a performance finding, never a fault). Arrival times are
corrected by each clock's estimated offset (clock.py); a rank late only because it waited for another group's
straggler is not named, and ranks late together are named together or not at all.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left
from dataclasses import dataclass

from .fmt import ms, rank_word
from .match import MatchResult
from .model import COMPLETED, P_COMPLETED, P_RECORD, Finding, PgView


@dataclass
class Options:
    straggler_min_ms: float = 1.0
    straggler_min_share: float = 0.5  # of the group's compared collectives, reached last
    straggler_min_count: int = 8  # fewer is chance: a rank of a 4-rank group is last in 3 of 3 one time in 64
    # the median lateness, after clock correction, must also be this many times the uncertainty of the
    # hosts' clock offsets, and this share of the group's median interval between collectives
    straggler_min_uncertainties: float = 5.0
    straggler_min_period_share: float = 0.02


def straggler_findings(m: MatchResult, opts: Options) -> list[tuple[int, Finding]]:
    """Ranks late by their own doing, by a margin the clocks' uncertainty and the group's pace make material.

    match.py's tally (who arrived last, by how much) picks the groups worth a look; in each, every collective is
    looked at again: the members whose arrival is that margin after the middle rank's are late in it. A late
    arrival is the rank's own unless it left its previous op (of any group, ``record_id`` order) late: its time
    from that op's end to this arrival exceeds the usual one (of the ranks around the middle) by less than half
    its lateness; then it was delayed inside that op (waiting there for another group's straggler, or late there
    itself) and the lateness is that op's. A rank late by its own doing in its share of the collectives is a
    straggler, named once (in the group it is most often late in), with the other stragglers of that group:
    ranks late together are named together, never whichever of them happened to be last. Arrivals are on the
    reference host's clock (match.py corrects them by each host's estimated offset); gaps on each rank's own."""
    prev_end = _PrevEnd(m.pgs)
    # rank -> (group, late count, compared, median, max, (the group's period, its clocks' uncertainty))
    found: dict[int, list[tuple[PgView, int, int, float, float, tuple[float, float]]]] = {}
    for v, st in m.late:
        unc = m.clocks.uncertainty(v.ranks)
        if math.isinf(unc):  # a host of this group whose clock could not be measured: arrivals do not compare
            continue
        # last by chance in 1/size of the collectives: a pair's member is last in half of them anyway
        share = max(opts.straggler_min_share, 1.5 / max(len(v.ranks), 1))
        floor = max(opts.straggler_min_ms * 1e6, opts.straggler_min_uncertainties * unc)
        # the tally only picks the group: ranks late together share its "last" between them
        if not any(len(mg) >= max(opts.straggler_min_count, share * st.n / 2) and statistics.median(mg) >= floor
                   for mg in st.last.values()):
            continue
        period = _period(v)
        thr = max(floor, opts.straggler_min_period_share * period)
        n, own = _own_lateness(v, m.clocks.offset, thr, prev_end)
        need = max(opts.straggler_min_count, share * n)
        for r, margins in own.items():
            if len(margins) < need:
                continue
            med = statistics.median(margins)
            found.setdefault(r, []).append((v, len(margins), n, med, max(margins), (period, unc)))
    # each rank once, in the group it is most often late in; the stragglers of one group together
    by_group: dict[int, tuple[PgView, list[tuple[int, int, int, float, float, tuple[float, float], list[str]]]]] = {}
    for r, vals in found.items():
        vals.sort(key=lambda t: (-t[1] / t[2], -t[3]))
        v, k, n, med, mx, why = vals[0]
        by_group.setdefault(id(v), (v, []))[1].append((r, k, n, med, mx, why, [x[0].label for x in vals[1:]]))
    out: list[tuple[int, int, Finding]] = []
    for v, rows in by_group.values():
        rows.sort()
        rs = [row[0] for row in rows]
        n = rows[0][2]
        med = statistics.median(row[3] for row in rows)
        if len(rows) == 1:
            r, k, _, _, mx, pace, also = rows[0]
            detail = (f"rank {r} reached {k} of {n} collectives of pg {v.label} late by its own doing, a median "
                      f"{ms(med)} after the middle rank (max {ms(mx)})")
        else:
            pace, also = rows[0][5], sorted({a for row in rows for a in row[6]})
            each = ", ".join(f"rank {row[0]} {row[1]}" for row in rows)
            detail = (f"{rank_word(rs)} reached the collectives of pg {v.label} late together, each by its own doing "
                      f"({each} of {n}), a median {ms(med)} after the middle rank: which of them arrives last is "
                      "chance")
        period, unc = pace
        why = (f"{ms(med)} is {100 * med / period:.0f} % of the group's median interval between collectives"
               if period else "") + (f"; clocks of its hosts corrected, uncertain to {ms(unc)}" if unc else "")
        if why:
            detail += f" ({why.lstrip('; ')})"
        if also:
            detail += "; also late in pg " + ", ".join(also)
        out.append((-int(med), Finding("straggler", v.name, v.desc, None, "", rs, detail, "performance")))
    return out


STRAGGLER_OPS = 512  # newest collectives of a group looked at again for who is late in each


class _PrevEnd:
    """When each rank's op before a given one (``record_id`` order, any group, p2p ops too) ended, on its own
    clock: built per rank on first use, for the few ranks found late."""

    def __init__(self, pgs: list[PgView]) -> None:
        self.pgs = pgs
        self.cache: dict[int, tuple[list[int], list[int]]] = {}

    def before(self, r: int, record: int) -> int:
        """End of rank r's newest op issued before ``record``; 0 if none or unknown."""
        got = self.cache.get(r)
        if got is None:
            ops: list[tuple[int, int]] = []
            for v in self.pgs:
                rp = v.per_rank.get(r)
                if rp is None:
                    continue
                ops += zip(rp.c_record, rp.c_end)
                ops += ((p[P_RECORD], p[P_COMPLETED]) for p in rp.p2ps)
            ops.sort()
            got = self.cache[r] = ([a for a, _ in ops], [b for _, b in ops])
        i = bisect_left(got[0], record)
        return got[1][i - 1] if i > 0 else 0


def _own_lateness(v: PgView, offs: dict[int, int], thr: float, prev_end: _PrevEnd) -> tuple[int, dict[int, list[int]]]:
    """(collectives compared, rank -> its margins over the middle rank where it was late by its own doing) over the
    group's newest STRAGGLER_OPS collectives that every member issued and completed."""
    members = list(v.ranks)
    rps = [v.per_rank.get(r) for r in members]
    if any(rp is None or not len(rp.c_seq) for rp in rps):
        return 0, {}
    hi = min(rp.c_seq[-1] for rp in rps)  # type: ignore[union-attr]
    lo = max(max(rp.c_seq[0] for rp in rps), hi - STRAGGLER_OPS + 1)  # type: ignore[union-attr]
    if hi < lo:
        return 0, {}
    cols = []  # per member: (state, arrival, record) over seqs lo..hi; None where the member lacks one of them
    for rp in rps:
        i0 = rp.slot(lo)  # type: ignore[union-attr]
        i1 = i0 + hi - lo
        if i0 >= 0 and i1 < len(rp.c_seq) and rp.c_seq[i1] == hi:  # type: ignore[union-attr]  # contiguous
            cols.append((rp.c_state[i0:i1 + 1], rp.c_arrive[i0:i1 + 1], rp.c_record[i0:i1 + 1]))  # type: ignore
        else:
            slots = [rp.slot(q) for q in range(lo, hi + 1)]  # type: ignore[union-attr]
            cols.append(tuple([c[i] if i >= 0 else None for i in slots]  # type: ignore[index]
                              for c in (rp.c_state, rp.c_arrive, rp.c_record)))  # type: ignore[union-attr]
    mid = (len(members) - 1) // 2
    own: dict[int, list[int]] = {}
    n = 0
    for k in range(hi - lo + 1):
        if any(c[0][k] != COMPLETED or not c[1][k] for c in cols):
            continue
        n += 1
        arr = [c[1][k] - offs.get(r, 0) for r, c in zip(members, cols)]
        order = sorted(range(len(members)), key=arr.__getitem__)
        middle = arr[order[mid]]
        # late: by the threshold, and within half the last one's margin of it (ranks late together, not the jitter
        # of the ones in between)
        cut = max(thr, (arr[order[-1]] - middle) / 2)
        usual: float | None = None  # the time the ranks around the middle took from their previous op to this one
        for j in (j for j in order if arr[j] - middle >= cut):
            if usual is None:
                near = [g for i in order[max(0, mid - 1):mid + 2] if arr[i] - middle < thr
                        and (g := _gap(prev_end, members[i], cols[i], k)) is not None]
                usual = statistics.median(near) if near else math.nan
            margin = arr[j] - middle
            gap = _gap(prev_end, members[j], cols[j], k)
            if gap is not None and not math.isnan(usual) and gap - usual < margin / 2:
                continue  # it left its previous op late, not this one: the lateness is that op's, not its own
            own.setdefault(members[j], []).append(margin)
    return n, own


def _gap(prev_end: _PrevEnd, r: int, col: tuple, k: int) -> int | None:
    """Rank r's time from the end of its previous op to its arrival at the op of slot ``k`` (its own clock)."""
    end = prev_end.before(r, col[2][k])
    return col[1][k] - end if end else None


PERIOD_OPS = 512  # newest collectives of a group that give its pace


def _period(v: PgView) -> float:
    """The group's median interval between consecutive collectives (ns) on one member, 0 if unknown."""
    for rp in v.per_rank.values():
        col = rp.c_arrive[-PERIOD_OPS:]
        gaps = [b - a for a, b in zip(col, col[1:]) if a and b and b > a]
        if gaps:
            return float(statistics.median(gaps))
    return 0.0
