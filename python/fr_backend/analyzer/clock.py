"""Each host's clock offset, estimated from the dumps themselves.

Every time in a dump is the writing host's wall clock, and NTP leaves hosts a few ms apart: compared
as they are, ranks of one host look late by its offset. The members of a collective leave it at
(almost) the same moment, so the ends of completed collectives measure the offsets: per collective,
each rank's end against the collective's corrected median end; per rank, the median of those
residuals, iterated until the offsets settle, from a first guess placed outwards from the lowest rank
through the collectives (so a 10-minute offset settles as fast as a 1 ms one). Only groups spanning
hosts are used (all groups when there is one host): a group within one host says nothing of its
clock's offset. Medians make it robust to the odd late completion discovery. The uncertainty of an
offset is the standard error of that median (from the residuals' median absolute deviation).

Ranks of one host share a clock: when their dumps show one kernel (the same boot moment on the wall
clock, header.kernel_boot_ns), or else when their offsets agree (within their uncertainty), the host's
median is used for all of them, with a smaller uncertainty. The kernel decides first because observed
ends carry a bias of their own per rank: a CPU op's end is seen on the rank's watchdog poll, whose phase
differs per rank by up to its 10 ms period, which the offsets then take for a clock difference. When
neither holds (dumps shifted per rank, or a hostname shared by containers with their own clocks), each
rank keeps its own, and the host's entry in the report says so.

Only the newest completed collectives of each such group are used (SAMPLES_PER_PG, MAX_SAMPLES), so the
cost is bounded whatever the size of the dumps.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from itertools import repeat
from operator import sub
from statistics import median
from typing import Any

from . import colops
from .colops import has_zero
from .model import COMPLETED, LoadResult, PgView

SAMPLES_PER_PG = 64  # newest completed collectives per group spanning hosts
MAX_SAMPLES = 4096  # collectives in all
ITERATIONS = 12
MIN_UNCERTAINTY_NS = 1_000  # the resolution claimed at best: 1 us
AGREE_NS = 20_000  # a host's ranks within this of their median share its clock, whatever the uncertainties
# A host's ranks whose boot moments are this close run on one kernel: the two clock reads of a dump are
# adjacent, but a writer preempted between them takes a scheduler slice (a few ms) on a loaded host. Two
# machines of one hostname whose boot moments fall this close are the risk taken.
ONE_KERNEL_NS = 20_000_000


@dataclass
class HostClock:
    host: str
    ranks: list[int]
    offset_ns: int  # this host's clock minus the reference host's (its ranks' median)
    uncertainty_ns: int | None  # None: no collective shared with another clock ended here
    samples: int  # collectives that measured it (per rank, the most)
    # when the host's ranks do not agree on one clock: each rank's own offset (and each is corrected by it)
    rank_offsets_ns: dict[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"host": self.host, "ranks": list(self.ranks), "offset_ns": self.offset_ns,
               "uncertainty_ns": self.uncertainty_ns, "samples": self.samples,
               "ranks_share_a_clock": self.rank_offsets_ns is None}
        if self.rank_offsets_ns is not None:
            out["rank_offsets_ns"] = {str(r): o for r, o in sorted(self.rank_offsets_ns.items())}
        return out


@dataclass
class Clocks:
    hosts: list[HostClock] = field(default_factory=list)
    reference: str = ""  # the host whose clock the offsets are given against (the lowest rank's)
    offset: dict[int, int] = field(default_factory=dict)  # rank -> correction (only non-zero ones)
    rank_uncertainty: dict[int, float] = field(default_factory=dict)  # rank -> ns (inf: not measured)
    host_of: dict[int, int] = field(default_factory=dict)  # rank -> index into hosts

    def uncertainty(self, ranks: tuple[int, ...] | list[int]) -> float:
        """How far apart the corrected clocks of these ranks may still be (ns): 0 when they share a host
        whose ranks agree on one clock, inf when one of them could not be measured."""
        hs = {self.host_of.get(r, -1) for r in ranks}
        if len(hs) <= 1 and -1 not in hs and self.hosts and self.hosts[next(iter(hs))].rank_offsets_ns is None:
            return 0.0
        worst = 0.0
        for r in ranks:
            worst = max(worst, self.rank_uncertainty.get(r, math.inf))
            if math.isinf(worst):
                return worst
        return 2 * worst  # any two of them: each off by up to its own uncertainty

    def to_json(self) -> dict[str, Any]:
        return {"reference_host": self.reference, "hosts": [h.to_json() for h in self.hosts],
                "method": "median of each rank's collective end times against the collective's median end; "
                          "a host's ranks pooled when they agree"}


def host_name(s_host: str, rank: int) -> str:
    """Ranks without a hostname (torch's dumps) are taken each to have its own clock."""
    return s_host if s_host else f"rank {rank}"


def estimate(res: LoadResult, pgs: list[PgView]) -> Clocks:
    ranks = sorted(res.ranks)
    names: dict[str, int] = {}
    members: list[list[int]] = []
    host_of: dict[int, int] = {}
    for r in ranks:
        h = host_name(res.ranks[r].hostname, r)
        i = names.get(h)
        if i is None:
            i = names[h] = len(members)
            members.append([])
        members[i].append(r)
        host_of[r] = i
    out = Clocks(host_of=host_of, rank_uncertainty={r: 0.0 for r in ranks})
    if not members:
        return out
    out.reference = next(iter(names))
    if len(ranks) == 1:
        out.hosts = [HostClock(out.reference, members[0], 0, 0, 0)]
        return out

    unit = {r: k for k, r in enumerate(ranks)}
    samples = _samples(pgs, unit, host_of)
    n = len(ranks)
    off = _seed(samples, n)
    resid: list[list[float]] = [[] for _ in range(n)]
    for _ in range(ITERATIONS):
        resid = [[] for _ in range(n)]
        for units, rows in samples:
            o = [off[k] for k in units]
            per_coll = []
            for ends in rows:
                vals = list(map(sub, ends, o))
                per_coll.append(list(map(sub, vals, repeat(median(vals)))))
            for k, col in zip(units, zip(*per_coll)):  # the order of a unit's residuals does not matter
                resid[k].extend(col)
        step = 0.0
        for k in range(n):
            if resid[k]:
                d = median(resid[k])
                off[k] += d
                step = max(step, abs(d))
        if step < 100:  # 0.1 us: settled
            break
    se = [_std_error(x) for x in resid]

    # per host: one clock when its ranks agree, else each rank its own
    corr: dict[int, float] = {}
    unc: dict[int, float] = {}
    for h, rs in enumerate(members):
        ks = [unit[r] for r in rs if resid[unit[r]]]
        if not ks:
            for r in rs:
                corr[r], unc[r] = 0.0, math.inf
            out.hosts.append(HostClock(list(names)[h], rs, 0, None, 0))
            continue
        mid = median(off[k] for k in ks)
        spread = max(abs(off[k] - mid) for k in ks)
        typical = median(se[k] for k in ks)
        agree = spread <= max(4 * typical, AGREE_NS)
        shared = agree or _one_kernel([res.ranks[r].boot_ns for r in rs])
        # one kernel whose ranks' ends disagree: each rank's ends carry a bias of their own (a watchdog's poll
        # phase), which the host's median against other hosts carries too
        host_unc = typical / math.sqrt(len(ks)) if agree else max(typical / math.sqrt(len(ks)), spread / 2)
        for r in rs:
            k = unit[r]
            if shared:  # a rank no collective measured shares its host's clock too
                corr[r], unc[r] = mid, host_unc
            else:
                corr[r], unc[r] = (off[k], se[k]) if resid[k] else (0.0, math.inf)
        out.hosts.append(HostClock(list(names)[h], rs, int(round(mid)), None, max(len(resid[k]) for k in ks),
                                   None if shared else {r: int(round(off[unit[r]])) for r in rs if resid[unit[r]]}))
    # against the reference host (the lowest rank's), and its uncertainty carried into every other one
    base = corr[ranks[0]]
    u0 = unc[ranks[0]]
    ref_host = 0
    for h, hc in enumerate(out.hosts):
        hc.offset_ns -= int(round(base))
        if hc.rank_offsets_ns is not None:
            hc.rank_offsets_ns = {r: o - int(round(base)) for r, o in hc.rank_offsets_ns.items()}
        us = [unc[r] for r in hc.ranks]
        if h == ref_host:
            worst = max(us)
        else:
            worst = max(math.hypot(u, u0) for u in us)
        hc.uncertainty_ns = None if not math.isfinite(worst) else max(int(worst), MIN_UNCERTAINTY_NS)
    for r in ranks:
        o = int(round(corr[r] - base))
        if o:
            out.offset[r] = o
        u = unc[r] if out.host_of[r] == ref_host else math.hypot(unc[r], u0)
        out.rank_uncertainty[r] = u if not math.isfinite(u) else max(u, MIN_UNCERTAINTY_NS)
    return out


def _one_kernel(boots: list[int | None]) -> bool:
    """Whether these ranks' dumps were written on one kernel, so on one wall clock."""
    if any(b is None for b in boots):
        return False
    return max(boots) - min(boots) <= ONE_KERNEL_NS  # type: ignore[type-var,operator]


def _std_error(resid: list[float]) -> float:
    """Standard error of the median of the residuals, from their median absolute deviation."""
    n = len(resid)
    if n < 2:
        return math.inf if n else 0.0
    m = median(resid)
    mad = median(list(map(abs, map(sub, resid, repeat(m)))))
    return 1.2533 * 1.4826 * mad / math.sqrt(n)


def _seed(samples: Samples, n: int) -> list[float]:
    """A first guess of each unit's offset, so that the iterations start near the answer whatever its size
    (each one moves a unit by a median residual, which halves a large offset at best). From the lowest
    unit, outwards through the collectives: an unplaced member is placed by the median of its end against
    the median corrected end of the placed members; a unit no collective links to one placed starts a
    component of its own at 0."""
    off = [0.0] * n
    placed = [False] * n
    todo = {k for units, _ in samples for k in units}  # units no collective measured stay at 0
    while todo:
        start = min(todo)
        placed[start] = True
        todo.discard(start)
        grew = True
        while grew:
            grew = False
            cands: dict[int, list[float]] = {}
            for units, rows in samples:  # placed changes between passes only: a group's split holds for its rows
                anchors = [(i, off[k]) for i, k in enumerate(units) if placed[k]]
                if not anchors or len(anchors) == len(units):
                    continue
                free = [i for i, k in enumerate(units) if not placed[k]]
                per_coll = []
                for ends in rows:
                    c = median([ends[i] - o for i, o in anchors])
                    per_coll.append([ends[i] - c for i in free])
                for i, col in zip(free, zip(*per_coll)):
                    cands.setdefault(units[i], []).extend(col)
            for k, xs in cands.items():
                off[k] = median(xs)
                placed[k] = True
                todo.discard(k)
                grew = True
    return off


# Per group spanning clocks: its members' units, and per collective sampled their ends (ns, relative to the
# first member's), in the order of the units.
Samples = list[tuple[list[int], list[list[float]]]]


def _samples(pgs: list[PgView], unit: dict[int, int], host_of: dict[int, int]) -> Samples:
    """Per completed collective of a group: (rank's unit, its end), relative to one of the ends. Only groups
    spanning hosts: a group within one host ends at the same moment on its one clock, so it says nothing of
    that clock's offset, and its zero residuals would outvote those that do. When no group spans hosts (one
    host), every group is used: it measures ranks of that host whose clocks differ."""
    spanning = [v for v in pgs if len({host_of.get(r, -1) for r in v.per_rank}) > 1]
    out: Samples = []
    count = 0  # collectives sampled
    for v in sorted(spanning or pgs, key=lambda v: -len(v.per_rank)):  # the widest first: they link the most clocks
        data = [(unit[r], rp) for r, rp in v.per_rank.items() if r in unit and len(rp.c_seq)]
        if len(data) < 2:
            continue
        lo = max(rp.c_seq[0] for _, rp in data)
        hi = min(rp.c_seq[-1] for _, rp in data)
        # the newest seqs every member completed with an end time, among the newest 4 * SAMPLES_PER_PG
        # held by all: each member's window is looked at in C when it holds it whole (contiguous seqs)
        wlo = max(lo, hi - 4 * SAMPLES_PER_PG + 1)
        if wlo > hi:
            continue
        width = hi - wlo + 1
        bad: set[int] = set()
        windows: list[tuple[int, array | None]] = []  # per member: (slot of wlo, its ends) or (-1, None)
        for _, rp in data:
            j0 = rp.slot(wlo)
            j1 = j0 + width - 1
            if j0 >= 0 and j1 < len(rp.c_seq) and rp.c_seq[j1] == hi:  # contiguous over the window
                st, en = rp.c_state[j0:j1 + 1], rp.c_end[j0:j1 + 1]
                failed = rp.failed and any(wlo <= q <= hi for q in rp.failed)
                if st.count(COMPLETED) != width or has_zero(en) or failed:
                    bad.update(wlo + x for x in range(width)
                               if st[x] != COMPLETED or not en[x] or wlo + x in rp.failed)
                windows.append((j0, en))
            else:
                for q in range(wlo, hi + 1):
                    i = rp.slot(q)
                    if i < 0 or rp.c_state[i] != COMPLETED or not rp.c_end[i] or q in rp.failed:
                        bad.add(q)
                windows.append((-1, None))
        take = min(SAMPLES_PER_PG, MAX_SAMPLES - count)
        chosen = [q for q in range(hi, wlo - 1, -1) if q not in bad][:take]
        if not chosen:
            continue
        lo_i, hi_i = chosen[-1] - wlo, chosen[0] - wlo
        run = hi_i - lo_i + 1 == len(chosen)  # no seq left out: a window's slice, newest first
        cols = [(en[lo_i:hi_i + 1][::-1] if run else [en[q - wlo] for q in chosen]) if en is not None
                else [rp.c_end[rp.slot(q)] for q in chosen] for (_, en), (_, rp) in zip(windows, data)]
        rows = []
        for ends in colops.rows(cols):  # doubles keep ns exact near 0, not at 1.7e18
            rows.append(list(map(float, map(sub, ends, repeat(ends[0])))))
        out.append(([k for k, _ in data], rows))
        count += len(rows)
        if count >= MAX_SAMPLES:
            break
    return out
