"""Compact, per-rank form of a dump: what the matcher needs, nothing more.

A loaded dump is reduced to a :class:`RankSummary` right away and the raw dict is
dropped, so memory stays proportional to (ranks x entries x a few small fields).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCHEDULED, STARTED, COMPLETED = 0, 1, 2
STATE_NAMES = ("scheduled", "started", "completed")


# Per-op records are plain tuples, not objects: millions of them cross process
# boundaries (pickled in C) and sit in memory, so they must stay small and cheap.
#
# Coll: one collective on one rank: a single op, or a whole coalesced group (one seq id).
#   (seq, name, names_key, sizes_key, dtypes_key, state, t_created, t_started, t_completed,
#    t_arrive, record_id, n_ops, sig)
# name is for display ("all_reduce", "coalesced[broadcast,broadcast]"); names/sizes/dtypes keys are
# what must agree across ranks; t_arrive is when the rank reached the op (GPU start if timed, else
# creation); sig is (names_key, sizes_key, dtypes_key), equal across ranks when they agree. Times are wall-clock ns corrected by the rank's store_offset_ns; 0 = unknown.
Coll = tuple  # type alias; see the C_* indices
(C_SEQ, C_NAME, C_NAMES, C_SIZES, C_DTYPES, C_STATE, C_CREATED, C_STARTED, C_COMPLETED, C_ARRIVE, C_RECORD,
 C_NOPS, C_SIG) = range(13)

# P2P: one send or recv on one rank.
#   (seq, kind "send"|"recv", peer global rank (-1 unknown), sizes_key, dtypes_key, state,
#    t_created, t_started, t_completed, record_id, profiling_name)
P2P = tuple
(P_SEQ, P_KIND, P_PEER, P_SIZES, P_DTYPES, P_STATE, P_CREATED, P_STARTED, P_COMPLETED, P_RECORD,
 P_NAME) = range(11)


@dataclass(slots=True)
class RankPg:
    """What one rank knows about one process group."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    colls: dict[int, Coll] = field(default_factory=dict)
    p2ps: list[P2P] = field(default_factory=list)
    dropped_coll: int = -1  # history at or below this seq is gone
    dropped_p2p: int = -1
    last_enqueued_coll: int = 0
    last_enqueued_p2p: int = 0
    last_completed_coll: int = 0


@dataclass(slots=True)
class LastOp:
    pg: str
    name: str
    seq: int
    state: int
    record_id: int
    frame: str = ""


@dataclass(slots=True)
class RankSummary:
    rank: int
    path: str
    fmt: str  # "frnccl" | "torch"
    version: str
    world_size: int | None = None
    hostname: str = ""
    pid: int | None = None
    incident_id: str = ""
    dump_reason: str = ""
    dump_detail: str = ""
    trigger_rank: int | None = None
    dump_time_ns: int = 0
    thread_stacks: str = ""
    n_entries: int = 0
    buffer_size: int | None = None
    pgs: dict[str, RankPg] = field(default_factory=dict)
    last_op: LastOp | None = None
    default_pg_size: int | None = None

    def pg(self, name: str) -> RankPg | None:
        return self.pgs.get(name)


@dataclass(slots=True)
class LoadProblem:
    path: str
    reason: str


@dataclass
class LoadResult:
    ranks: dict[int, RankSummary]
    problems: list[LoadProblem]
    source: str  # the folder or files analysed
    world_size: int
    notes: list[str] = field(default_factory=list)

    @property
    def missing(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.ranks]


@dataclass
class Finding:
    kind: str
    pg: str
    pg_desc: str
    collective_seq_id: int | None
    op: str
    culprit_ranks: list[int]
    detail: str
    severity: str = "fault"  # "fault" | "suspect" | "info"
    evidence: list[str] = field(default_factory=list)  # extra lines for people (stacks, chains)
    victims: list[int] = field(default_factory=list)
    p2p_seq_id: int | None = None
    ranks: list[int] = field(default_factory=list)  # ranks concerned, for informational findings

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "pg": self.pg,
            "pg_desc": self.pg_desc,
            "collective_seq_id": self.collective_seq_id,
            "op": self.op,
            "culprit_ranks": list(self.culprit_ranks),
            "detail": self.detail,
            "severity": self.severity,
            "victim_ranks": list(self.victims),
            "p2p_seq_id": self.p2p_seq_id,
            "ranks": list(self.ranks) or list(self.culprit_ranks),
            "evidence": list(self.evidence),
        }
