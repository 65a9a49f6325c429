"""Each host's clock offset, estimated from the dumps themselves.

Every time in a dump is the writing host's wall clock, and NTP leaves hosts a few ms apart: compared
as they are, ranks of one host look late by its offset. The members of a collective leave it at
(almost) the same moment, so the ends of completed collectives measure the offsets: per collective,
each rank's end against the collective's corrected median end; per rank, the median of those
residuals, iterated until the offsets settle. Medians make it robust to the odd late completion
discovery. The uncertainty of an offset is the standard error of that median (from the residuals'
median absolute deviation).

Ranks of one host share a clock: when their offsets agree (within their uncertainty), the host's
median is used for all of them, with a smaller uncertainty. When they do not (dumps shifted per rank,
or a hostname shared by containers with their own clocks), each rank keeps its own, and the host's
entry in the report says so.

Only the newest completed collectives of each group are used (SAMPLES_PER_PG, MAX_SAMPLES), so the
cost is bounded whatever the size of the dumps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Any

from .model import COMPLETED, LoadResult

if TYPE_CHECKING:
    from .match import PgView

SAMPLES_PER_PG = 64  # newest completed collectives per group spanning hosts
MAX_SAMPLES = 4096  # collectives in all
ITERATIONS = 12
MIN_UNCERTAINTY_NS = 1_000  # the resolution claimed at best: 1 us
AGREE_NS = 20_000  # a host's ranks within this of their median share its clock, whatever the uncertainties


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
    samples = _samples(pgs, unit)
    n = len(ranks)
    off = [0.0] * n
    resid: list[list[float]] = [[] for _ in range(n)]
    for _ in range(ITERATIONS):
        resid = [[] for _ in range(n)]
        for coll in samples:
            vals = [e - off[k] for k, e in coll]
            c = median(vals)
            for (k, _), v in zip(coll, vals):
                resid[k].append(v - c)
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
        shared = spread <= max(4 * typical, AGREE_NS)
        for r in rs:
            k = unit[r]
            if shared:  # a rank no collective measured shares its host's clock too
                corr[r], unc[r] = mid, typical / math.sqrt(len(ks))
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


def _std_error(resid: list[float]) -> float:
    """Standard error of the median of the residuals, from their median absolute deviation."""
    n = len(resid)
    if n < 2:
        return math.inf if n else 0.0
    m = median(resid)
    mad = median(abs(x - m) for x in resid)
    return 1.2533 * 1.4826 * mad / math.sqrt(n)


def _samples(pgs: list[PgView], unit: dict[int, int]) -> list[list[tuple[int, float]]]:
    """Per completed collective of a group: (rank's unit, its end), relative to one of the ends."""
    out: list[list[tuple[int, float]]] = []
    for v in sorted(pgs, key=lambda v: -len(v.per_rank)):  # the widest groups first: they link the most clocks
        data = [(unit[r], rp) for r, rp in v.per_rank.items() if r in unit and len(rp.c_seq)]
        if len(data) < 2:
            continue
        lo = max(rp.c_seq[0] for _, rp in data)
        hi = min(rp.c_seq[-1] for _, rp in data)
        got = 0
        s = hi
        while s >= lo and got < SAMPLES_PER_PG and len(out) < MAX_SAMPLES and s > hi - 4 * SAMPLES_PER_PG:
            ends: list[tuple[int, int]] = []
            for k, rp in data:
                i = rp.slot(s)
                if i < 0 or rp.c_state[i] != COMPLETED or not (e := rp.c_end[i]) or s in rp.failed:
                    break
                ends.append((k, e))
            s -= 1
            if len(ends) == len(data):  # doubles keep ns exact near 0, not at 1.7e18
                base = ends[0][1]
                out.append([(k, float(e - base)) for k, e in ends])
                got += 1
        if len(out) >= MAX_SAMPLES:
            break
    return out
