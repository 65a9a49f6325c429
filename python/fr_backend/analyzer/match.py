"""Cross-rank matching, per process group (a PG is its name plus its member ranks).

Collectives are aligned by collective seq id, p2p ops by (src, dst) pair. Each rank's
history is only trusted above its last dropped seq, so a cut ring buffer never looks
like a mismatch. Nothing here depends on the order files were listed in: every
verdict is a vote over all members, ranks are visited in ascending order.

The output is raw evidence (mismatches, who waits on whom, arrival statistics);
findings.py turns it into ranked findings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter, methodcaller

from .model import (
    C_ARRIVE,
    C_CREATED,
    C_DTYPES,
    C_NAME,
    C_NAMES,
    C_SIG,
    C_SIZES,
    C_STATE,
    COMPLETED,
    P_CREATED,
    P_KIND,
    P_NAME,
    P_PEER,
    P_SEQ,
    P_SIZES,
    P_STATE,
    Coll,
    LoadResult,
    RankPg,
)


@dataclass
class PgView:
    """One process group across all ranks."""

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
class Mismatch:
    pg: PgView
    seq: int
    kind: str  # op_mismatch | size_mismatch | dtype_mismatch
    groups: list[tuple[str, list[int]]]  # value -> ranks, biggest first
    culprits: list[int]
    tie: bool
    hanging: bool  # some rank has not completed it
    op: str
    t_created: int
    p2p: bool = False


@dataclass
class Wait:
    """Ranks ``waiters`` are inside an op that ranks ``targets`` never issued."""

    pg: PgView
    seq: int
    p2p: bool
    op: str
    waiters: list[int]
    targets: list[int]
    missing_targets: list[int]
    t_created: int


@dataclass
class Blocked:
    pg: PgView
    seq: int
    op: str
    p2p: bool


@dataclass
class LateStat:
    n: int = 0  # collectives in which every member's arrival is known
    last: dict[int, list[int]] = field(default_factory=dict)  # rank -> margins (ns) when it arrived last


@dataclass
class MatchResult:
    pgs: list[PgView]
    mismatches: list[Mismatch]
    waits: list[Wait]
    blocked: dict[int, list[Blocked]]  # rank -> its non-completed ops (oldest first per PG)
    late: list[tuple[PgView, LateStat]]
    truncated: dict[int, list[str]]  # rank -> PGs whose history is cut


def build_pgs(res: LoadResult) -> list[PgView]:
    views: dict[tuple[str, tuple[int, ...]], PgView] = {}
    for rank, s in res.ranks.items():
        for rp in s.pgs.values():
            members = rp.ranks or (rank,)
            key = (rp.name, members)
            v = views.get(key)
            if v is None:
                v = views[key] = PgView(rp.name, rp.desc, members, {}, [])
            if rank in members:
                v.per_rank[rank] = rp
    for v in views.values():
        for r in v.ranks:
            if r in v.per_rank:
                continue
            if r in res.ranks:  # its dump does not know this group: it never created it
                v.per_rank[r] = RankPg(name=v.name, desc=v.desc, ranks=v.ranks)
            else:
                v.missing.append(r)
        v.per_rank = dict(sorted(v.per_rank.items()))
        v.max_seq = max((rp.last_enqueued_coll for rp in v.per_rank.values()), default=0)
    return sorted(views.values(), key=lambda v: (_name_key(v.name), v.ranks))


def _name_key(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)


def match(res: LoadResult) -> MatchResult:
    pgs = build_pgs(res)
    out = MatchResult(pgs, [], [], {}, [], {})
    for v in pgs:
        _match_collectives(v, out)
        _match_p2p(v, out)
        for r, rp in v.per_rank.items():
            if rp.dropped_coll > 0 or rp.dropped_p2p > 0:
                out.truncated.setdefault(r, []).append(v.name)
    return out


def _match_collectives(v: PgView, out: MatchResult) -> None:
    present = list(v.per_rank.items())
    if not present:
        return
    n_members = len(v.ranks)
    seqs: set[int] = set()
    for _, rp in present:
        seqs.update(rp.colls)
    late = LateStat()
    blocked = out.blocked
    ranks_ = [r for r, _ in present]
    maps = [rp.colls for _, rp in present]
    full = n_members > 1 and len(present) == n_members
    get_sig, get_state, get_arrive = itemgetter(C_SIG), itemgetter(C_STATE), itemgetter(C_ARRIVE)
    for s in sorted(seqs):
        row = list(map(methodcaller("get", s), maps))  # per present rank; None where not issued / cut
        cs = list(filter(None, row))
        same = len(set(map(get_sig, cs))) == 1
        hanging = set(map(get_state, cs)) != {COMPLETED}
        if hanging or not same:
            recs = [(r, c) for r, c in zip(ranks_, row) if c is not None]
            if hanging:
                for r, c in recs:
                    if c[C_STATE] == COMPLETED:
                        continue
                    bl = blocked.get(r)
                    if bl is None:
                        blocked[r] = [Blocked(v, s, c[C_NAME], False)]
                    elif not any(b.pg is v and not b.p2p for b in bl):
                        bl.append(Blocked(v, s, c[C_NAME], False))
            if not same:
                out.mismatches.append(_classify(v, s, recs, hanging))
                continue
        if full and len(cs) == n_members:
            arr = list(map(get_arrive, cs))
            if all(arr):
                mx = max(arr)
                i = arr.index(mx)
                margin = mx - sorted(arr)[(len(arr) - 1) // 2]
                late.n += 1
                late.last.setdefault(ranks_[i], []).append(margin)
    if late.n:
        out.late.append((v, late))
    _not_joined(v, present, out)


def _classify(v: PgView, s: int, recs: list[tuple[int, Coll]], hanging: bool) -> Mismatch:
    for kind, idx in (("op_mismatch", C_NAMES), ("size_mismatch", C_SIZES), ("dtype_mismatch", C_DTYPES)):
        by: dict[str, list[int]] = {}
        for r, c in recs:
            by.setdefault(c[idx], []).append(r)
        if len(by) > 1:
            break
    groups = sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    top = len(groups[0][1])
    tie = len(groups) > 1 and len(groups[1][1]) == top
    if tie:  # no majority: every side is a suspect
        culprits = sorted(r for _, rs in groups for r in rs)
    else:
        culprits = sorted(r for _, rs in groups[1:] for r in rs)
    label = {r: c[C_NAME] for r, c in recs}
    op = label[groups[0][1][0]]
    if kind == "op_mismatch":
        groups = [(label[rs[0]], rs) for _, rs in groups]
    return Mismatch(v, s, kind, groups, culprits, tie, hanging, op, min(c[C_CREATED] for _, c in recs))


def _not_joined(v: PgView, present: list[tuple[int, RankPg]], out: MatchResult) -> None:
    """Who is waiting in a collective that some members never issued."""
    last = {r: rp.last_enqueued_coll for r, rp in present}
    frontier = sorted({L + 1 for L in last.values() if L < v.max_seq})
    for s in frontier:
        waiters: list[int] = []
        op = ""
        t0 = 0
        for r, rp in present:
            c = rp.colls.get(s)
            if c is not None and c[C_STATE] != COMPLETED:
                waiters.append(r)
                op = op or c[C_NAME]
                t0 = min(t0, c[C_CREATED]) if t0 else c[C_CREATED]
        if not waiters:
            continue
        targets = [r for r, L in last.items() if L < s]
        out.waits.append(Wait(v, s, False, op, waiters, targets, list(v.missing), t0))
    if v.missing:
        # every present member issued it and waits in it: the missing members are the suspects
        lo = min(last.values())
        pending: list[int] = []
        for _, rp in present:
            s = min(rp.last_enqueued_coll, lo)
            while s > rp.dropped_coll and (c := rp.colls.get(s)) is not None and c[C_STATE] != COMPLETED:
                pending.append(s)
                s -= 1
        if pending:
            s = min(pending)
            waiters = [r for r, rp in present if (c := rp.colls.get(s)) is not None and c[C_STATE] != COMPLETED]
            c = v.per_rank[waiters[0]].colls[s]
            out.waits.append(Wait(v, s, False, c[C_NAME], waiters, [], list(v.missing), c[C_CREATED]))


def _match_p2p(v: PgView, out: MatchResult) -> None:
    """Pair the pending sends and recvs of each (src, dst); completed ones had a partner."""
    pending: dict[tuple[int, int], tuple[list[tuple], list[tuple]]] = {}
    any_p2p = False
    for r, rp in v.per_rank.items():
        for p in rp.p2ps:
            any_p2p = True
            if p[P_STATE] == COMPLETED or p[P_PEER] < 0:
                continue
            if p[P_KIND] == "send":
                pending.setdefault((r, p[P_PEER]), ([], []))[0].append(p)
            else:
                pending.setdefault((p[P_PEER], r), ([], []))[1].append(p)
            bl = out.blocked.setdefault(r, [])
            if not any(b.pg is v and b.p2p for b in bl):
                bl.append(Blocked(v, p[P_SEQ], p[P_NAME], True))
    if not any_p2p:
        return
    for (src, dst), (sends, recvs) in sorted(pending.items()):
        sends.sort(key=lambda p: p[P_SEQ])
        recvs.sort(key=lambda p: p[P_SEQ])
        for a, b in zip(sends, recvs):
            if a[P_SIZES] != b[P_SIZES]:
                out.mismatches.append(Mismatch(
                    v, a[P_SEQ], "size_mismatch", [(f"send {a[P_SIZES]}", [src]), (f"recv {b[P_SIZES]}", [dst])],
                    [src, dst], True, True, f"send/recv {src}->{dst}", a[P_CREATED], p2p=True))
        if len(sends) > len(recvs):
            extra = sends[len(recvs)]
            waiter, target = src, dst
        elif len(recvs) > len(sends):
            extra = recvs[len(sends)]
            waiter, target = dst, src
        else:
            continue
        if target in v.per_rank:
            out.waits.append(Wait(v, extra[P_SEQ], True, extra[P_NAME], [waiter], [target], [], extra[P_CREATED]))
        elif target in v.missing:
            out.waits.append(Wait(v, extra[P_SEQ], True, extra[P_NAME], [waiter], [], [target], extra[P_CREATED]))
