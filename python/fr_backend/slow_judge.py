"""Which rank makes the job slow: judged from each rank's waits in its collectives, window by window.

In a collective every member completes at about the same time, so how long a rank waits in it (from
issuing it to its completion) says how early it came: the rank the others wait for waits least. Per group
and window each rank reports quantiles of its waits (`GroupReport`); a rank is *late* in a group by how
much less it waits than the others do (the median of the others' median waits, less its own).

A late rank is named slow only where all of this holds (each is a refusal that keeps an innocent out):
- it is later than it was in the group's first judged windows (its baseline), by a fifth of that baseline
  at least: a rank that is late from the start (rank 0's logging, a pipeline stage with more work) is the
  program's own;
- the others lose a real share of the window to it (`min_share`): its lateness once per op, but no more than
  the time they spend inside the group's collectives beyond what it spends (overlapping ops, as DDP's
  buckets, are late together and count once); and it is late by at least `min_late_s`;
- it ran no p2p op in the window: a pipeline stage that waited in a recv for a slow stage reaches its next
  collective late, and its recv waits are not among those compared;
- it waits less in all its groups together than the median rank does, by about what it costs them: a rank
  that is late in one group only because it waited for the slow rank in another (a DeviceMesh's tp peer
  reaching dp late) waits as long as everyone else in all;
- it stands out of the members' spread this window (4 median absolute deviations, in groups of 4 or more);
- few ranks of the group are late (at most one in eight, at least one): where many are, it is the program;
- it was so in `persist` judged windows in a row, so that one pause (a checkpoint, a GC) is never a slow rank.
It recovers after `persist` windows in a row at less than half the bar. Nothing here reads a clock or the
store: the detector (fr_backend.slow) feeds it what the ranks posted.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

QUANTILES = tuple(q / 10 for q in range(1, 10))  # 10% .. 90%: a rank's line stays a few hundred bytes
BASELINE_WINDOWS = 3
MIN_OPS = 20  # a window with fewer ops of a group on a rank says nothing of that group
NOISE_MADS = 4.0  # how far out of the members' spread (median absolute deviation) a late rank must stand


@dataclass(frozen=True)
class GroupReport:
    """One rank's collectives of one group in one window."""

    name: str
    desc: str
    size: int
    rank_in_group: int
    op: str  # the op it ran most in the window
    ops: int
    quantiles_s: tuple[float, ...]  # its waits at QUANTILES
    busy_share: float  # the share of the window it spent inside the group's collectives (overlaps once)

    @property
    def median_s(self) -> float:
        return self.quantiles_s[len(self.quantiles_s) // 2]

    def share_below(self, wait_s: float) -> float:
        """The share of its ops that waited less than `wait_s` (from its quantiles)."""
        below = sum(1 for q in self.quantiles_s if q < wait_s)
        return min(1.0, (below + 0.5) / (len(self.quantiles_s) + 1)) if below else 0.0


@dataclass(frozen=True)
class RankReport:
    rank: int
    host: str
    pid: int
    wait_share: float  # the time it spent inside collectives of any group, as a share of the window
    groups: tuple[GroupReport, ...]
    ran_p2p: bool = False  # it sent or received in the window: its waits there are not in wait_share


@dataclass(frozen=True)
class Lateness:
    """A rank's lateness in a group in one window."""

    group: str
    desc: str
    op: str
    rank: int
    late_s: float  # above its baseline
    share: float  # of the window the others lose to it (at most what they spend in the group beyond it)
    last_share: float  # of its ops it entered after the others' median wait would have let it
    ops: int


@dataclass(frozen=True)
class Finding:
    """A log line's worth: a rank found slow, or well again."""

    kind: str  # "slow" or "recovered"
    rank: int
    host: str
    pid: int
    lateness: tuple[Lateness, ...]  # by share, largest first
    ops: int  # in the windows that decided it


def median_without(ordered: list[float], value: float) -> float:
    """The median of `ordered` (sorted, holding `value`) less one element equal to `value`: the others' median
    for each member in O(log n), where a sort per member would be O(n^2 log n) at a world group's size."""
    i = bisect.bisect_left(ordered, value)
    m = len(ordered) - 1  # the others

    def at(p: int) -> float:
        return ordered[p if p < i else p + 1]

    return at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2


@dataclass
class _Track:
    baseline_s: dict[int, float] = field(default_factory=dict)  # rank -> its lateness in the first windows
    judged: int = 0


@dataclass
class _RankState:
    slow_windows: int = 0
    well_windows: int = 0
    named: bool = False
    ops: int = 0
    last_window: int = -2  # the window it was last judged in: streaks count windows in a row only


class SlowJudge:
    """Keeps the baselines and the streaks across windows; `judge` takes one window's reports."""

    def __init__(self, min_share: float = 0.05, min_late_s: float = 0.002, persist: int = 2) -> None:
        self.min_share = min_share
        self.min_late_s = min_late_s
        self.persist = persist
        self.tracks: dict[str, _Track] = {}
        self.ranks: dict[int, _RankState] = {}
        self.last: dict[str, list[Lateness]] = {}  # group -> its latest lateness, latest first (status)
        self.window = -1

    def judge(self, reports: list[RankReport], window_s: float, window: int = -1) -> list[Finding]:
        """One window's reports; `window` (its index) keeps streaks to windows in a row (-1: the next one)."""
        self.window = self.window + 1 if window < 0 else window
        by_rank = {r.rank: r for r in reports}
        members: dict[str, list[tuple[int, GroupReport]]] = {}
        for r in reports:
            for g in r.groups:
                if g.ops >= MIN_OPS and len(g.quantiles_s) == len(QUANTILES):
                    members.setdefault(g.name, []).append((r.rank, g))
        shares = sorted(r.wait_share for r in reports)
        median_share = shares[len(shares) // 2] if shares else 0.0
        late_now: dict[int, list[Lateness]] = {}
        judged_ranks: set[int] = set()
        self.last = {}
        for name, group in members.items():
            size = group[0][1].size
            if len(group) < 2 or len(group) < size:  # every member must have spoken for its ops to compare
                continue
            track = self.tracks.setdefault(name, _Track())
            track.judged += 1
            medians = sorted(g.median_s for _, g in group)
            busy = sorted(g.busy_share for _, g in group)
            ops = sorted(x.ops for _, x in group)[len(group) // 2]
            lateness: list[Lateness] = []
            for rank, g in group:
                ref = median_without(medians, g.median_s)
                raw = ref - g.median_s
                if track.judged <= BASELINE_WINDOWS:
                    track.baseline_s[rank] = min(track.baseline_s.get(rank, raw), raw)
                    continue
                baseline = max(0.0, track.baseline_s.get(rank, 0.0))
                # Late above its start by a margin that grows with how late it was by design.
                late = raw - baseline if raw - baseline >= 0.2 * baseline else min(0.0, raw - baseline)
                # What the others lose: its lateness once per op, but never more than the time they spend in
                # the group beyond what it spends (its ops overlap: DDP's buckets are late together).
                lost = max(0.0, median_without(busy, g.busy_share) - g.busy_share)
                share = min(max(0.0, late) * ops / window_s, lost)
                lateness.append(Lateness(name, g.desc, g.op, rank, late, share, g.share_below(ref - late / 2), g.ops))
            judged_ranks.update(rank for rank, _ in group)
            if track.judged <= BASELINE_WINDOWS:
                continue
            lateness.sort(key=lambda x: -x.share)
            self.last[name] = lateness[:8]
            # The members' own spread this window: a rank must stand out of it, not only pass the bars (jitter of
            # a few ms between ranks' medians is common and names no one).
            mid = medians[len(medians) // 2]
            deviations = sorted(abs(m - mid) for m in medians)
            noise = NOISE_MADS * deviations[len(deviations) // 2] if len(medians) >= 4 else 0.0
            over = [x for x in lateness if x.share >= self.min_share and x.late_s >= max(self.min_late_s, noise)]
            if len(over) > max(1, size // 8):
                continue  # many late ranks: the program's own pattern, or every rank slowed together
            for x in over:
                own = by_rank[x.rank]
                if own.ran_p2p:
                    continue  # a pipeline stage may be late for a recv from a slow stage: not counted in its waits
                if own.wait_share > median_share - x.share / 2:
                    continue  # it waits as much as the others elsewhere: late here for another's sake
                late_now.setdefault(x.rank, []).append(x)
        return self._streaks(late_now, judged_ranks, by_rank)

    def _streaks(self, late_now: dict[int, list[Lateness]], judged: set[int],
                 by_rank: dict[int, RankReport]) -> list[Finding]:
        findings: list[Finding] = []
        for rank in judged:
            state = self.ranks.setdefault(rank, _RankState())
            if state.last_window != self.window - 1:
                state.slow_windows = state.well_windows = 0  # windows between were not judged
            state.last_window = self.window
            mine = late_now.get(rank)
            if mine:
                state.slow_windows += 1
                state.well_windows = 0
                state.ops += max(x.ops for x in mine)
                if not state.named and state.slow_windows >= self.persist:
                    state.named = True
                    findings.append(self._finding("slow", by_rank[rank], mine, state.ops))
                continue
            state.slow_windows = 0
            state.ops = 0
            if not state.named:
                continue
            half = [x for g in self.last.values() for x in g if x.rank == rank
                    and x.share >= self.min_share / 2 and x.late_s >= self.min_late_s / 2]
            if half:
                state.well_windows = 0
                continue
            state.well_windows += 1
            if state.well_windows >= self.persist:
                state.named = False
                state.well_windows = 0
                now = [x for g in self.last.values() for x in g if x.rank == rank]
                findings.append(self._finding("recovered", by_rank[rank], now, 0))
        return findings

    @staticmethod
    def _finding(kind: str, report: RankReport, lateness: list[Lateness], ops: int) -> Finding:
        return Finding(kind, report.rank, report.host, report.pid, tuple(sorted(lateness, key=lambda x: -x.share)), ops)

    def slow_ranks(self) -> list[int]:
        return sorted(rank for rank, state in self.ranks.items() if state.named)


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


def _where(x: Lateness) -> str:
    # new_group without group_desc says "undefined": the group's name says more then
    return f"{x.desc}'s {x.op}" if x.desc and x.desc != "undefined" else f"group {x.group}'s {x.op}"


def finding_line(f: Finding) -> str:
    """The log line (without the "frnccl: " prefix)."""
    who = f"rank {f.rank} (host {f.host}, pid {f.pid})"
    if f.kind == "recovered":
        worst = f.lateness[0] if f.lateness else None
        detail = f" ({_ms(max(0.0, worst.late_s))} on median in {_where(worst)})" if worst else ""
        return f"slow: {who} is no longer late{detail}"
    first = f.lateness[0]
    also = [_where(x) for x in f.lateness[1:3]]
    more = f" (also {', '.join(also)})" if also else ""
    return (f"slow: {who} enters {_where(first)} last in {first.last_share:.0%} of the last {f.ops}, "
            f"{_ms(first.late_s)} late on median{more}; the other ranks lose about {min(first.share, 1.0):.0%} "
            f"of their time waiting for it")
