"""Aftershocks: a later incident that follows from an earlier one's abort or exit.

After a failure incident frnccl aborts the groups of the rank whose op timed out, and a rank whose op failed
raises and usually exits. A rank that goes on with the same groups afterwards (a stalled rank that wakes, a
shutdown handler's broadcast) waits for peers that left them, and its op fails or times out: a second
incident, often a local one (the store's host has exited), with that rank's dump only. Read alone, it names
the peers it waited for as missing. They are not the cause: the earlier incident holds what happened.

A later incident L follows from an earlier failure incident E when the dumps show all of:

* the same processes: every rank of L dumped in E too, with the same host and pid (no restart between);
* L's ranks are in, or failed in, ops (collective or p2p) of groups that E shows broken: another member of the
  group had an op of it, at or before that seq, fail (retired without completing) in E, or time out: still in
  flight at its dump of E, past its group's timeout. Which of the two a timed-out rank's dump shows is a race
  of its threads: Gloo's own timeout fails the op, or frnccl's watchdog sees the deadline pass first and dumps
  with the op still open (then aborts the groups);
* those ops were issued after E: above what the rank's own dump in E had issued in that group.

A rank of L with no open op, or an open op in a group E does not show broken, leaves L an incident of its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .fmt import rank_word
from .model import COMPLETED, P_CREATED, P_SEQ, P_STATE, LoadResult, RankPg, RankSummary

FAILURE_REASONS = ("timeout", "error", "exception")  # HeartbeatMonitor's isFailure


@dataclass
class Aftershock:
    """Incident ``incident`` (its folder) follows from the one analysed: ``why`` says on what evidence."""

    incident: str
    reason: str
    ranks: list[int]
    why: str

    def to_json(self) -> dict[str, object]:
        return {"incident": self.incident, "reason": self.reason, "ranks": list(self.ranks), "why": self.why}

    def text(self) -> str:
        return (f"later incident {self.incident} ({self.reason}, {rank_word(self.ranks)}) follows from this one: "
                f"{self.why}; --incident {os.path.basename(self.incident)} reads it alone")


def open_ops(rp: RankPg) -> list[tuple[bool, int]]:
    """(p2p, seq) of the ops this rank is still inside, or that failed, in this group."""
    out = [(False, s) for s, st in zip(rp.c_seq, rp.c_state) if st != COMPLETED]
    out += [(False, s) for s in rp.failed if rp.slot(s) < 0]
    out += [(True, p[0]) for p in rp.p2ps if p[5] != COMPLETED]
    out += [(True, s) for s in rp.failed_p2p]
    return sorted(set(out))


def _timed_out(s: RankSummary, rp: RankPg, p2p: bool, seq: int) -> bool:
    """Whether this rank's dump shows an op of the group at or before ``seq`` still open past the group's
    timeout: timed out, not yet failed when the watchdog dumped (frnccl aborts the groups after that dump)."""
    if not rp.timeout_ms or not s.dump_time_ns or rp.untrusted_states:
        return False  # no deadline to compare with, or states that do not say an op is open
    deadline = s.dump_time_ns - rp.timeout_ms * 1_000_000  # created at or before this: past its timeout
    if p2p:
        return any(p[P_SEQ] <= seq and p[P_STATE] != COMPLETED and 0 < p[P_CREATED] <= deadline for p in rp.p2ps)
    return any(q <= seq and st != COMPLETED and 0 < t <= deadline
               for q, st, t in zip(rp.c_seq, rp.c_state, rp.c_created))


def _broken_at(earlier: LoadResult, pg: str, members: tuple[int, ...], me: int, p2p: bool, seq: int) -> int | None:
    """A member of group ``pg`` other than ``me`` whose op of it at or before ``seq`` failed or timed out in
    ``earlier``."""
    for u in members:
        s = earlier.ranks.get(u)
        rp = s.pgs.get(pg) if s is not None and u != me else None
        if s is None or rp is None or tuple(rp.ranks) != tuple(members):
            continue
        failed = rp.failed_p2p if p2p else rp.failed
        if any(f <= seq for f in failed) or _timed_out(s, rp, p2p, seq):
            return u
    return None


def _same_process(a: RankSummary, b: RankSummary) -> bool:
    return bool(a.pid) and a.pid == b.pid and a.hostname == b.hostname


def follows(later: LoadResult, earlier: LoadResult) -> str | None:
    """Why ``later`` follows from ``earlier`` (see the module's doc), or None where the dumps do not show it."""
    if not any(s.dump_reason in FAILURE_REASONS for s in earlier.ranks.values()):
        return None
    said: list[str] = []
    for r, s in sorted(later.ranks.items()):
        e = earlier.ranks.get(r)
        if e is None or not _same_process(s, e):
            return None
        opened = False
        for name, rp in s.pgs.items():
            mine = e.pgs.get(name)
            for p2p, seq in open_ops(rp):
                before = (mine.last_enqueued_p2p if p2p else mine.last_enqueued_coll) if mine is not None else 0
                if seq <= before:
                    return None  # an op the rank had issued already in the earlier incident: not one issued after it
                u = _broken_at(earlier, name, tuple(rp.ranks), r, p2p, seq)
                if u is None:
                    return None
                opened = True
                if len(said) < 3:
                    said.append(f"rank {r} issued {'p2p ' if p2p else ''}seq {seq} of pg {name} after that incident, "
                                f"where rank {u}'s op of that group had failed or timed out (frnccl aborts a "
                                "timed-out rank's groups, a failed op raises in its caller)")
        if not opened:
            return None
    return "; ".join(said) if said else None
