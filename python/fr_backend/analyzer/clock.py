"""Each host's clock offset, estimated from the dumps themselves.

Every time in a dump is the writing host's wall clock, and NTP leaves hosts a few ms apart: compared
as they are, ranks of one host look late by its offset. The members of a collective leave it at
(almost) the same moment, so the ends of completed collectives measure the offsets: per collective,
each host's end (the median over its ranks: ranks of one host share a clock) against the collective's
corrected median end; per host, the median of those residuals, iterated until the offsets settle.
Medians make it robust to the odd late completion discovery. The uncertainty of a host's offset is
the standard error of that median (from the residuals' median absolute deviation).

Only the newest completed collectives of each group spanning hosts are used (SAMPLES_PER_PG), so the
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


@dataclass
class HostClock:
    host: str
    ranks: list[int]
    offset_ns: int  # this host's clock minus the reference host's
    uncertainty_ns: int | None  # None: no collective shared with another host ended here
    samples: int  # collectives that measured it

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "ranks": list(self.ranks), "offset_ns": self.offset_ns,
                "uncertainty_ns": self.uncertainty_ns, "samples": self.samples}


@dataclass
class Clocks:
    hosts: list[HostClock] = field(default_factory=list)
    reference: str = ""  # the host whose clock the offsets are given against (rank 0's, or the lowest rank's)
    offset: dict[int, int] = field(default_factory=dict)  # rank -> its host's offset (only non-zero ones)
    host_of: dict[int, int] = field(default_factory=dict)  # rank -> index into hosts

    def uncertainty(self, ranks: tuple[int, ...] | list[int]) -> float:
        """How far apart the corrected clocks of these ranks may still be (ns): 0 when they share a host,
        inf when a host among them could not be measured."""
        hs = {self.host_of.get(r, -1) for r in ranks}
        if len(hs) <= 1:
            return 0.0
        worst = 0.0
        for h in hs:
            if h < 0:
                return math.inf
            u = self.hosts[h].uncertainty_ns
            if u is None:
                return math.inf
            worst = max(worst, float(u))
        return 2 * worst  # any two of them: each off by up to its own uncertainty

    def to_json(self) -> dict[str, Any]:
        return {"reference_host": self.reference, "hosts": [h.to_json() for h in self.hosts],
                "method": "median of each host's collective end times against the collective's median end"}


def host_name(s_host: str, rank: int) -> str:
    """Ranks without a hostname (torch's dumps) are taken each to have its own clock."""
    return s_host if s_host else f"rank {rank}"


def estimate(res: LoadResult, pgs: list[PgView]) -> Clocks:
    names: dict[str, int] = {}
    members: list[list[int]] = []
    host_of: dict[int, int] = {}
    for r in sorted(res.ranks):
        h = host_name(res.ranks[r].hostname, r)
        i = names.get(h)
        if i is None:
            i = names[h] = len(members)
            members.append([])
        members[i].append(r)
        host_of[r] = i
    out = Clocks(host_of=host_of)
    if not members:
        return out
    n_hosts = len(members)
    ref = 0  # the host of the lowest rank
    out.reference = next(iter(names))
    if n_hosts == 1:
        out.hosts = [HostClock(out.reference, members[0], 0, 0, 0)]
        return out

    samples = _samples(pgs, host_of)
    off = [0.0] * n_hosts
    resid: list[list[float]] = [[] for _ in range(n_hosts)]
    for _ in range(ITERATIONS):
        resid = [[] for _ in range(n_hosts)]
        for coll in samples:
            vals = [e - off[h] for h, e in coll]
            c = median(vals)
            for (h, _), v in zip(coll, vals):
                resid[h].append(v - c)
        step = 0.0
        for h in range(n_hosts):
            if resid[h]:
                d = median(resid[h])
                off[h] += d
                step = max(step, abs(d))
        if step < 100:  # 0.1 us: settled
            break
    base = off[ref]
    se = [_std_error(x) for x in resid]
    for h, name in enumerate(names):
        n = len(resid[h])
        e = se[h] if h == ref else math.hypot(se[h], se[ref])
        u: int | None = int(e) if n and resid[ref] and math.isfinite(e) else None  # one sample: no spread known
        o = int(round(off[h] - base)) if n else 0
        if u is not None:
            u = max(u, MIN_UNCERTAINTY_NS)
        out.hosts.append(HostClock(name, members[h], o, u, n))
    out.offset = {r: out.hosts[h].offset_ns for r, h in host_of.items() if out.hosts[h].offset_ns}
    return out


def _std_error(resid: list[float]) -> float:
    """Standard error of the median of the residuals, from their median absolute deviation."""
    n = len(resid)
    if n < 2:
        return math.inf if n else 0.0
    m = median(resid)
    mad = median(abs(x - m) for x in resid)
    return 1.2533 * 1.4826 * mad / math.sqrt(n)


def _samples(pgs: list[PgView], host_of: dict[int, int]) -> list[list[tuple[int, float]]]:
    """Per completed collective of a group spanning hosts: (host, median end of its ranks there)."""
    out: list[list[tuple[int, float]]] = []
    for v in sorted(pgs, key=lambda v: -len(v.per_rank)):  # the widest groups first: they link the most hosts
        data = [(host_of[r], rp) for r, rp in v.per_rank.items() if r in host_of and len(rp.c_seq)]
        if len(data) < 2 or len({h for h, _ in data}) < 2:
            continue
        lo = max(rp.c_seq[0] for _, rp in data)
        hi = min(rp.c_seq[-1] for _, rp in data)
        got = 0
        s = hi
        while s >= lo and got < SAMPLES_PER_PG and len(out) < MAX_SAMPLES and s > hi - 4 * SAMPLES_PER_PG:
            by_host: dict[int, list[int]] = {}
            ok = True
            for h, rp in data:
                i = rp.slot(s)
                if i < 0 or rp.c_state[i] != COMPLETED or not (e := rp.c_end[i]) or s in rp.failed:
                    ok = False
                    break
                by_host.setdefault(h, []).append(e)
            s -= 1
            if ok:  # relative to one of its ends: doubles keep ns exact there, not at 1.7e18
                base = next(iter(by_host.values()))[0]
                out.append([(h, float(median(es)) - base) for h, es in by_host.items()])
                got += 1
        if len(out) >= MAX_SAMPLES:
            break
    return out
