"""Compact, per-rank form of a dump: what the matcher needs, nothing more.

A loaded dump is reduced to a :class:`RankSummary` right away (reduce.py; columnar.py for a compact
dump) and the raw dict is dropped, so memory stays proportional to ranks x entries x ~50 bytes (the
columns).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

SCHEDULED, STARTED, COMPLETED = 0, 1, 2
STATE_NAMES = ("scheduled", "started", "completed")


# A rank's collectives of one PG are kept as columns (one slot per seq it holds, ascending):
# arrays of machine ints cost a few bytes per op, cross process boundaries as raw bytes, and
# compare across ranks in C (a slice of one rank against the same slice of another).
#
# Sig: what one op (or one coalesced group) was, shared by every op that looked the same:
#   (name, names_key, sizes_key, dtypes_key, n_ops)
# name is for display ("all_reduce", "coalesced[broadcast,broadcast]"); the three keys are what
# must agree across ranks. A rank's RankPg.c_sig holds indices into RankPg.sigs; once loaded,
# every rank's ``sigs`` is the same global table (LoadResult.sigs) and equal Sigs have equal ids.
Sig = tuple
S_NAME, S_NAMES, S_SIZES, S_DTYPES, S_NOPS = range(5)

# Coll: the tuple view of one slot (RankPg.colls), for the trace, the HTML report and tests:
#   (seq, name, names_key, sizes_key, dtypes_key, state, t_created, t_started, t_completed,
#    t_arrive, record_id, n_ops, sig)
# t_arrive is when the rank reached the op (GPU start if timed, else creation); sig is
# (names_key, sizes_key, dtypes_key), equal across ranks when they agree. Times are the rank's wall-clock
# ns as dumped (old dumps' clock.store_offset_ns, when not 0, is subtracted); 0 = unknown. Hosts' clocks
# differ: clock.py estimates each host's offset, match.py corrects arrivals by it.
Coll = tuple  # type alias; see the C_* indices
(C_SEQ, C_NAME, C_NAMES, C_SIZES, C_DTYPES, C_STATE, C_CREATED, C_STARTED, C_COMPLETED, C_ARRIVE, C_RECORD,
 C_NOPS, C_SIG) = range(13)

# P2P: one send or recv on one rank.
#   (seq, kind "send"|"recv", peer global rank (-1 unknown), sizes_key, dtypes_key, state,
#    t_created, t_started, t_completed, record_id, profiling_name)
P2P = tuple
(P_SEQ, P_KIND, P_PEER, P_SIZES, P_DTYPES, P_STATE, P_CREATED, P_STARTED, P_COMPLETED, P_RECORD,
 P_NAME) = range(11)


def _i64() -> array:
    return array("q")


_PACK_MIN = 64
_PACKED: dict[int, tuple[tuple[int, ...], Any]] = {}  # id of a members tuple -> (it, how it travels)
_UNPACKED: dict[tuple[int, int, int], tuple[int, ...]] = {}  # a range that travelled -> its tuple
_PACK_CACHE_MAX = 64


def _pack_ranks(t: tuple[int, ...]) -> Any:
    """An evenly spaced members tuple as ("range", start, stop, step); any other as it is."""
    if len(t) < _PACK_MIN:
        return t
    got = _PACKED.get(id(t))
    if got is not None and got[0] is t:
        return got[1]
    step = t[1] - t[0]
    packed: Any = t
    if step > 0 and t == tuple(range(t[0], t[-1] + 1, step)):
        packed = ("range", t[0], t[-1] + 1, step)
    if len(_PACKED) >= _PACK_CACHE_MAX:
        _PACKED.clear()
    _PACKED[id(t)] = (t, packed)  # holds t: its id is not reused meanwhile
    return packed


def _unpack_ranks(v: Any) -> tuple[int, ...]:
    if type(v) is tuple and len(v) == 4 and v[0] == "range":
        key = (v[1], v[2], v[3])
        t = _UNPACKED.get(key)
        if t is None:
            if len(_UNPACKED) >= _PACK_CACHE_MAX:
                _UNPACKED.clear()
            t = _UNPACKED[key] = tuple(range(*key))
        return t
    return v


@dataclass(slots=True)
class RankPg:
    """What one rank knows about one process group.

    Collectives are columns with one slot per seq held (``c_seq`` ascending, unique, all above
    ``dropped_coll``); ``slot(seq)`` finds a seq's slot, ``colls`` is a read-only tuple view."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    c_seq: array = field(default_factory=_i64)
    c_sig: array = field(default_factory=lambda: array("i"))  # index into sigs
    c_state: bytes = b""  # SCHEDULED / STARTED / COMPLETED per slot
    c_created: array = field(default_factory=_i64)
    c_started: array = field(default_factory=_i64)
    c_completed: array = field(default_factory=_i64)
    c_arrive: array = field(default_factory=_i64)
    c_record: array = field(default_factory=_i64)
    # when the op ended: GPU end when timed, else when its completion was seen (often the c_completed object)
    c_end: array = field(default_factory=_i64)
    sigs: list[Sig] = field(default_factory=list)
    p2ps: list[P2P] = field(default_factory=list)
    dropped_coll: int = -1  # history at or below this seq is gone
    dropped_p2p: int = -1
    last_enqueued_coll: int = 0
    last_enqueued_p2p: int = 0
    last_completed_coll: int = 0
    # torch's gloo: the entries' state stays 'scheduled' after an op finished (retired=True): completion is
    # taken from pg_status, and scheduled vs started means nothing
    untrusted_states: bool = False
    timeout_ms: int = 0  # the group's op timeout as its pg_config gives it (frnccl dumps), 0 if unknown
    # frnccl dumps: ops retired without completing (the op failed, or timed out and was given up): the rank
    # is no longer inside them
    failed: set[int] = field(default_factory=set)
    failed_p2p: set[int] = field(default_factory=set)
    # members not in the dump (torch's gloo pg_config): resolved across ranks by load()
    world_members: bool = False  # the default group: every rank of the job

    # A loader worker sends each rank's summary to the analyzer in a pickle; the default group's members,
    # world_size of them in every rank's summary, travel as a range and come out as one shared tuple.
    def __getstate__(self) -> dict[str, Any]:
        state = {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]
        state["ranks"] = _pack_ranks(self.ranks)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["ranks"] = _unpack_ranks(state["ranks"])
        for k, v in state.items():
            object.__setattr__(self, k, v)

    def slot(self, seq: int) -> int:
        """Index of ``seq`` in the columns, or -1 when this rank holds no op with that seq."""
        cs = self.c_seq
        n = len(cs)
        if not n:
            return -1
        i = seq - cs[0]
        if 0 <= i < n and cs[i] == seq:  # the common case: contiguous seqs
            return i
        i = bisect_left(cs, seq)
        return i if i < n and cs[i] == seq else -1

    def coll_at(self, i: int) -> Coll:
        sig = self.sigs[self.c_sig[i]]
        return (self.c_seq[i], sig[0], sig[1], sig[2], sig[3], self.c_state[i], self.c_created[i], self.c_started[i],
                self.c_completed[i], self.c_arrive[i], self.c_record[i], sig[4], (sig[1], sig[2], sig[3]))

    @property
    def colls(self) -> CollView:
        return CollView(self)


class CollView(Mapping):  # type: ignore[type-arg]
    """seq -> Coll, computed on access from a RankPg's columns."""

    __slots__ = ("_rp",)

    def __init__(self, rp: RankPg) -> None:
        self._rp = rp

    def __getitem__(self, seq: int) -> Coll:
        i = self._rp.slot(seq) if type(seq) is int else -1
        if i < 0:
            raise KeyError(seq)
        return self._rp.coll_at(i)

    def __iter__(self) -> Iterator[int]:
        return iter(self._rp.c_seq)

    def __len__(self) -> int:
        return len(self._rp.c_seq)

    def values(self) -> Iterator[Coll]:  # type: ignore[override]
        rp = self._rp
        return (rp.coll_at(i) for i in range(len(rp.c_seq)))


@dataclass(slots=True)
class LastOp:
    pg: str
    name: str
    seq: int
    state: int
    record_id: int
    frame: str = ""
    thread_id: int = 0  # the issuing thread (pthread id): its stack in thread_stacks says where the rank is now


@dataclass(slots=True)
class ExitInfo:
    """The uncaught exception a rank was leaving the job with when it dumped (the dump's ``exit``)."""

    type: str
    message: str
    frame: str = ""
    traceback: str = ""
    time_ns: int = 0  # when it reached the top of the program; 0: not told

    def one_line(self) -> str:
        """"RuntimeError: CUDA out of memory ... at train.py:8 in forward": the message's first line."""
        first, _, more = self.message.partition("\n")
        text = f"{self.type}: {first}" if first else self.type
        if more:
            text += " ..."
        return f"{text} at {self.frame}" if self.frame else text


@dataclass(slots=True)
class RankSummary:
    rank: int
    path: str
    fmt: str  # "frnccl" | "torch"
    version: str
    world_size: int | None = None
    hostname: str = ""
    pid: int | None = None
    job_tag: str = ""  # which job wrote it (header job_tag, 8 hex digits); "" where the dump does not say
    incident_id: str = ""
    dump_reason: str = ""
    dump_detail: str = ""
    trigger_rank: int | None = None
    dump_time_ns: int = 0
    thread_stacks: str = ""
    n_entries: int = 0
    buffer_size: int | None = None
    boot_ns: int | None = None  # header.kernel_boot_ns: one value per kernel, so per wall clock
    pgs: dict[str, RankPg] = field(default_factory=dict)
    last_op: LastOp | None = None
    default_pg_size: int | None = None
    sigs: list[Sig] = field(default_factory=list)  # the table every RankPg.c_sig of this rank indexes
    # (pg name, collective seq) -> where its newest collectives were called from ("fn (file:line)")
    frames: dict[tuple[str, int], str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what could not be read as is (load() merges them per text)
    exit: ExitInfo | None = None  # the uncaught exception it was leaving the job with, if any

    def pg(self, name: str) -> RankPg | None:
        return self.pgs.get(name)


@dataclass(slots=True)
class LoadProblem:
    path: str
    reason: str


class DumpError(Exception):
    """One file is not a usable dump (the message is a one-line reason)."""


# What a damaged or hostile file can raise while it is read or reduced: reported per file.
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError, RecursionError,
             MemoryError, UnicodeError)


def first_line(exc: BaseException, limit: int = 80) -> str:
    """An exception's message, for a one-line error: its first line, or its type when it has none
    (MemoryError, some store errors)."""
    lines = str(exc).splitlines()
    return lines[0][:limit] if lines and lines[0].strip() else type(exc).__name__


@dataclass
class RankConflict:
    """Two or more usable files claim one rank (load._decide_claims): which was used, if any, and why."""

    rank: int
    paths: list[str]
    used: str | None  # None: none could be told to be the rank's own; the rank is left undecided
    note: str

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "files": list(self.paths), "used": self.used, "note": self.note}


@dataclass
class LoadResult:
    ranks: dict[int, RankSummary]
    problems: list[LoadProblem]
    source: str  # the folder or files analysed
    world_size: int
    notes: list[str] = field(default_factory=list)
    sigs: list[Sig] = field(default_factory=list)  # global Sig table: every rank's c_sig indexes it
    elsewhere: dict[int, str] = field(default_factory=dict)  # rank without a dump here -> incident that has one
    conflicts: list[RankConflict] = field(default_factory=list)
    earlier: list[str] = field(default_factory=list)  # older incident folders of the same dump directory, newest first
    job_tag: str = ""  # the job whose dumps these are ("" where they do not say): one job's, never two

    @cached_property
    def missing(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.ranks]

    @cached_property
    def undecided(self) -> set[int]:
        """Ranks without a dump because several files claim them and none could be told to be their own: not
        known to be missing, so no finding names them."""
        return {c.rank for c in self.conflicts if c.used is None}


FAULT_SEVERITIES = ("fault", "suspect")


@dataclass
class PgView:
    """One process group across all ranks: what match.py builds from the summaries, and clock.py reads."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    per_rank: dict[int, RankPg]  # present members only
    missing: list[int]
    max_seq: int = 0

    @property
    def label(self) -> str:
        return f"{self.name} ({self.desc})" if self.desc and self.desc != self.name else self.name


@dataclass
class Finding:
    kind: str
    pg: str
    pg_desc: str
    collective_seq_id: int | None
    op: str
    culprit_ranks: list[int]
    detail: str
    severity: str = "fault"  # "fault" | "suspect" | "performance" | "info"
    evidence: list[str] = field(default_factory=list)  # extra lines for people (stacks, chains)
    victims: list[int] = field(default_factory=list)
    p2p_seq_id: int | None = None
    ranks: list[int] = field(default_factory=list)  # ranks concerned, for informational findings

    @property
    def is_fault(self) -> bool:
        """A fault or suspect: what makes the exit code 1 and can be the ROOT CAUSE (not performance, not info)."""
        return self.severity in FAULT_SEVERITIES

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
