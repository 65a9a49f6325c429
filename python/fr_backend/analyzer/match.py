"""Cross-rank matching, per process group (a PG is its name plus its member ranks).

Collectives are aligned by collective seq id, p2p ops by (src, dst) pair. Each rank's
history is only trusted above its last dropped seq, so a cut ring buffer never looks
like a mismatch. Nothing here depends on the order files were listed in: every
verdict is a vote over all members, ranks are visited in ascending order.

The output is raw evidence (mismatches, who waits on whom, arrival statistics);
findings.py turns it into ranked findings.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from itertools import repeat
from operator import sub

from .clock import Clocks, estimate
from .colops import has_zero, rows

from .model import (
    COMPLETED,
    SCHEDULED,
    STARTED,
    P_CREATED,
    P_KIND,
    P_NAME,
    P_PEER,
    P_SEQ,
    P_SIZES,
    P_STATE,
    S_DTYPES,
    S_NAME,
    S_NAMES,
    S_SIZES,
    LoadResult,
    PgView,
    RankPg,
    Sig,
)


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
    # a tie among the ranks that dumped while members of the PG have no dump: those members would
    # decide which side is the odd one, so no side is blamed (culprits is empty)
    deciders: list[int] = field(default_factory=list)

    @property
    def ambiguous(self) -> bool:
        return bool(self.deciders)


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
    behind: int | None = None  # collectives: the newest seq of the PG any target issued
    state: int = -1  # p2p: the waiter's op state (SCHEDULED / STARTED)


@dataclass
class Stall:
    """Every member issued collective ``seq`` of ``pg`` (the oldest such seq of the PG that did not
    complete) and ``inside`` are still in it: nobody skipped it, the op itself does not finish."""

    pg: PgView
    seq: int
    op: str
    inside: list[int]  # members whose part did not complete
    done: list[int]  # members whose part completed (a failed op is marked completed too)
    # inside, but only scheduled while others started it: their device (or worker) never reached the op
    not_started: list[int]
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
    stalls: list[Stall] = field(default_factory=list)  # at most one per PG
    clocks: Clocks = field(default_factory=Clocks)  # hosts' clock offsets; arrivals in ``late`` are corrected


def build_pgs(res: LoadResult) -> list[PgView]:
    views: dict[tuple[str, int], PgView] = {}
    # Every rank's summary lists the default group's members (world_size of them): equal member tuples are
    # hashed once each, not once a rank, and membership is a set lookup, not a scan.
    canon: dict[tuple[int, ...], tuple[int, ...]] = {}
    by_id: dict[int, tuple[tuple[int, ...], frozenset[int] | tuple[int, ...]]] = {}  # id of a canonical tuple
    for rank, s in res.ranks.items():
        for rp in s.pgs.values():
            members = rp.ranks or (rank,)
            got = by_id.get(id(members))
            if got is None or got[0] is not members:
                c = canon.setdefault(members, members)
                got = by_id.get(id(c))
                if got is None:  # canon holds c: its id is not reused
                    got = by_id[id(c)] = (c, frozenset(c) if len(c) > 16 else c)
            key = (rp.name, id(got[0]))
            v = views.get(key)
            if v is None:
                v = views[key] = PgView(rp.name, rp.desc, got[0], {}, [])
            if rank in got[1]:
                v.per_rank[rank] = rp
    for v in views.values():
        for r in v.ranks:
            if r in v.per_rank:
                continue
            if r in res.ranks:  # its dump does not know this group: it never created it
                v.per_rank[r] = RankPg(name=v.name, desc=v.desc, ranks=v.ranks, sigs=res.sigs)
            else:
                v.missing.append(r)
        v.per_rank = dict(sorted(v.per_rank.items()))
        v.max_seq = max((rp.last_enqueued_coll for rp in v.per_rank.values()), default=0)
    return sorted(views.values(), key=lambda v: (_name_key(v.name), v.ranks))


def _name_key(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)


def match(res: LoadResult) -> MatchResult:
    pgs = build_pgs(res)
    clocks = estimate(res, pgs)
    out = MatchResult(pgs, [], [], {}, [], {}, clocks=clocks)
    offs = clocks.offset
    for v in pgs:
        _match_collectives(v, res.sigs, out, offs)
        _match_p2p(v, out, offs)
        for r, rp in v.per_rank.items():
            if rp.dropped_coll > 0 or rp.dropped_p2p > 0:
                out.truncated.setdefault(r, []).append(v.name)
    return out


def _shifted(col: array, off: int) -> array:
    """A column of times on the reference host's clock (0 stays unknown)."""
    if not off:
        return col
    if 0 in col:
        return array("q", [x - off if x else 0 for x in col])
    return array("q", map(sub, col, repeat(off)))


def _match_collectives(v: PgView, sigs: list[Sig], out: MatchResult, offs: dict[int, int]) -> None:
    """Per seq: do the ranks that issued it agree, and did it complete everywhere?

    A seq that every rank holding history of this PG issued, with the same signature, and that
    completed everywhere (almost all of them) is settled in bulk, by comparing each rank's
    columns with a reference rank's over the window all of them hold. Only the other seqs
    (disagreements, ops not completed, seqs some ranks do not hold) are looked at one by one."""
    present = list(v.per_rank.items())
    if not present:
        return
    n_members = len(v.ranks)
    data = [(r, rp) for r, rp in present if len(rp.c_seq)]
    full = n_members > 1 and len(present) == n_members
    late = LateStat()
    special: set[int] = set()
    bulk: list[tuple[int, int]] = []  # (i0, i1) per rank of data: the common window
    ref_seq = None
    if data:
        w_lo = max(rp.c_seq[0] for _, rp in data)
        w_hi = min(rp.c_seq[-1] for _, rp in data)
        for _, rp in data:
            cs = rp.c_seq
            i0 = bisect_left(cs, w_lo) if w_lo <= w_hi else len(cs)
            i1 = bisect_right(cs, w_hi) if w_lo <= w_hi else len(cs)
            bulk.append((i0, i1))
            special.update(cs[:i0])
            special.update(cs[i1:])
        rp0 = data[0][1]
        i0, i1 = bulk[0]
        ref_seq = rp0.c_seq[i0:i1]
        ref_sig = rp0.c_sig[i0:i1]
        ref_state = rp0.c_state[i0:i1]
        diff: set[int] = set()  # window positions where some rank differs from the reference
        for (_, rp), (j0, j1) in zip(data[1:], bulk[1:]):
            if rp.c_seq[j0:j1] != ref_seq:  # a rank with holes the others do not have: no bulk at all
                special.update(ref_seq)
                for _, rq in data:
                    special.update(rq.c_seq)
                ref_seq = None
                break
            _diff_positions(ref_sig, rp.c_sig[j0:j1], diff)
            _diff_positions(ref_state, rp.c_state[j0:j1], diff)
        if ref_seq is not None:
            special.update(ref_seq[k] for k in diff)
            special.update(ref_seq[k] for k in _positions_not(ref_state, COMPLETED))
    for s in sorted(special):
        _one_seq(v, s, data, sigs, full and len(data) == n_members, late, out, offs)
    if ref_seq is not None and full and len(data) == n_members and len(ref_seq):
        ranks_ = [r for r, _ in data]
        cols = [_shifted(rp.c_arrive[j0:j1], offs.get(r, 0)) for (r, rp), (j0, j1) in zip(data, bulk)]
        if len(ranks_) == 2:  # pairs (tp groups, pipeline stages): the margin is the gap between the two
            _late_pairs(ranks_, cols[0], cols[1], ref_seq, special, late)
        else:
            _late_rows(ranks_, cols, ref_seq, special, late)
    if late.n:
        out.late.append((v, late))
    _not_joined(v, present, sigs, out, offs)


def _late_rows(ranks_: list[int], cols: list[array], seqs: array, special: set[int], late: LateStat) -> None:
    """The generic rule, per seq of ``seqs`` not set apart whose arrivals (``cols``, one column per rank of
    ``ranks_``) are all known: the last rank to arrive (the first of equals), by its margin over the middle
    rank (the ``(len - 1) // 2``-th smallest arrival)."""
    mid = (len(ranks_) - 1) // 2
    last = late.last
    for s, arr in zip(seqs, rows(cols)):
        if s in special:
            continue
        srt = sorted(arr)  # the max and whether a time is unknown (0) come from it too
        z = bisect_left(srt, 0)
        if z < len(srt) and srt[z] == 0:
            continue
        mx = srt[-1]
        margin = mx - srt[mid]
        late.n += 1
        r = ranks_[arr.index(mx)]
        got = last.get(r)
        if got is None:
            last[r] = [margin]
        else:
            got.append(margin)


def _late_pairs(ranks_: list[int], a_col: object, b_col: object, seqs: object, special: set[int],
                late: LateStat) -> None:
    """The generic rule (the last arrival, its margin over the middle rank) for two ranks: the later
    one (the first on a tie), by the gap between them."""
    la: list[int]
    lb: list[int]
    if not has_zero(a_col) and not has_zero(b_col) and _disjoint(special, seqs):  # type: ignore[arg-type]
        # the usual case (both times known, no seq set apart), in C but for one comparison: 8,192 pairs of
        # 500 ops each at 16,384 ranks
        d = list(map(sub, a_col, b_col))  # type: ignore[call-overload]
        la = [x for x in d if x >= 0]
        lb = [-x for x in d if x < 0]
        late.n += len(la) + len(lb)
        for r, ms in ((ranks_[0], la), (ranks_[1], lb)):
            if ms:
                late.last.setdefault(r, []).extend(ms)
        return
    la = []
    lb = []
    for s, a, b in zip(seqs, a_col, b_col):  # type: ignore[call-overload]
        if not a or not b or s in special:
            continue
        if a >= b:
            la.append(a - b)
        else:
            lb.append(b - a)
    late.n += len(la) + len(lb)
    for r, ms in ((ranks_[0], la), (ranks_[1], lb)):
        if ms:
            late.last.setdefault(r, []).extend(ms)


def _disjoint(special: set[int], seqs: object) -> bool:
    """``special.isdisjoint(seqs)`` for ascending ``seqs``: a few bisections when few seqs are set apart."""
    if len(special) > 16 or type(seqs) is not array:
        return special.isdisjoint(seqs)  # type: ignore[arg-type]
    n = len(seqs)
    for s in special:
        i = bisect_left(seqs, s)
        if i < n and seqs[i] == s:
            return False
    return True


def _diff_positions(a: object, b: object, out: set[int], block: int = 256) -> None:
    """Add to ``out`` the positions where the equal-length sequences a and b differ."""
    if a == b:
        return
    n = len(a)  # type: ignore[arg-type]
    for k in range(0, n, block):
        x, y = a[k:k + block], b[k:k + block]  # type: ignore[index]
        if x != y:
            out.update(k + j for j, (p, q) in enumerate(zip(x, y)) if p != q)


def _positions_not(states: bytes, value: int) -> list[int]:
    if states.count(value) == len(states):
        return []
    return [k for k, x in enumerate(states) if x != value]


def _one_seq(v: PgView, s: int, data: list[tuple[int, RankPg]], sigs: list[Sig], all_members: bool,
             late: LateStat, out: MatchResult, offs: dict[int, int]) -> None:
    recs = []  # (rank, rp, slot) of the ranks that issued seq s
    for r, rp in data:
        i = rp.slot(s)
        if i >= 0:
            recs.append((r, rp, i))
    if not recs:
        return
    ids = {rp.c_sig[i] for _, rp, i in recs}
    same = len(ids) == 1 or len({sigs[x][S_NAMES:S_DTYPES + 1] for x in ids}) == 1
    hanging = any(rp.c_state[i] != COMPLETED for _, rp, i in recs)
    if hanging:
        blocked = out.blocked
        for r, rp, i in recs:
            if rp.c_state[i] == COMPLETED:
                continue
            b = Blocked(v, s, sigs[rp.c_sig[i]][S_NAME], False)
            bl = blocked.get(r)
            if bl is None:
                blocked[r] = [b]
            elif not any(x.pg is v and not x.p2p for x in bl):
                bl.append(b)
    if not same:
        out.mismatches.append(_classify(v, s, [(r, sigs[rp.c_sig[i]], _at(rp.c_created[i], r, offs))
                                               for r, rp, i in recs], hanging))
        return
    if hanging and all_members and len(recs) == len(v.ranks) and not (out.stalls and out.stalls[-1].pg is v):
        _stall(v, s, recs, sigs, out, offs)
    if all_members and len(recs) == len(v.ranks):
        arr = [_at(rp.c_arrive[i], r, offs) for r, rp, i in recs]
        if all(arr):
            mx = max(arr)
            margin = mx - sorted(arr)[(len(arr) - 1) // 2]
            late.n += 1
            late.last.setdefault(recs[arr.index(mx)][0], []).append(margin)


def _at(t: int, rank: int, offs: dict[int, int]) -> int:
    """A rank's time on the reference host's clock (0 stays unknown)."""
    return t - offs.get(rank, 0) if t else 0


def _stall(v: PgView, s: int, recs: list[tuple[int, RankPg, int]], sigs: list[Sig], out: MatchResult,
           offs: dict[int, int]) -> None:
    """Seq s was issued by every member and did not complete on some: record the PG's stall (seqs come
    oldest first, so the first one recorded is the one the others queue behind). A rank with a later op of
    the PG completed is past this one, whatever its state says."""
    inside: list[int] = []
    done: list[int] = []
    started = False
    for r, rp, i in recs:
        st = rp.c_state[i]
        if st == COMPLETED or COMPLETED in rp.c_state[i + 1:]:
            done.append(r)
            started = True
        else:
            inside.append(r)
            started = started or st == STARTED
    if not inside:
        return
    trusted = started and not any(rp.untrusted_states for _, rp, _ in recs)  # gloo: 'scheduled' means nothing
    not_started = [r for r, rp, i in recs if r in inside and rp.c_state[i] == SCHEDULED] if trusted else []
    _, rp0, i0 = recs[0]
    t0 = min((t for r, rp, i in recs if (t := _at(rp.c_created[i], r, offs))), default=0)
    out.stalls.append(Stall(v, s, sigs[rp0.c_sig[i0]][S_NAME], inside, done, not_started, t0))


def _classify(v: PgView, s: int, recs: list[tuple[int, Sig, int]], hanging: bool) -> Mismatch:
    for kind, idx in (("op_mismatch", S_NAMES), ("size_mismatch", S_SIZES), ("dtype_mismatch", S_DTYPES)):
        by: dict[str, list[int]] = {}
        for r, sig, _ in recs:
            by.setdefault(sig[idx], []).append(r)
        if len(by) > 1:
            break
    groups = sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    top = len(groups[0][1])
    second = len(groups[1][1]) if len(groups) > 1 else 0
    tie = len(groups) > 1 and second == top
    deciders: list[int] = []
    if len(groups) > 1 and len(v.missing) > top - second:
        # the members without a dump could outvote the majority of those with one: blame no side
        culprits, deciders = [], list(v.missing)
    elif tie:  # no majority among all members: every side is a suspect
        culprits = sorted(r for _, rs in groups for r in rs)
    else:
        culprits = sorted(r for _, rs in groups[1:] for r in rs)
    label = {r: sig[S_NAME] for r, sig, _ in recs}
    op = label[groups[0][1][0]]
    if kind == "op_mismatch":
        groups = [(label[rs[0]], rs) for _, rs in groups]
    return Mismatch(v, s, kind, groups, culprits, tie, hanging, op, min(t for _, _, t in recs), deciders=deciders)


def _not_joined(v: PgView, present: list[tuple[int, RankPg]], sigs: list[Sig], out: MatchResult,
                offs: dict[int, int]) -> None:
    """Who is waiting in a collective that some members never issued.

    Each rank waits in its oldest op of the PG that did not complete and that some member has not
    issued (above the lowest last_enqueued seq): one or more seqs ahead of those members, since an op
    may complete on some ranks without the others (the root of a small broadcast)."""
    last = {r: rp.last_enqueued_coll for r, rp in present}
    lo = min(last.values())
    by_seq: dict[int, list[tuple[int, RankPg, int]]] = {}
    for r, rp in present:
        if last[r] <= lo:
            continue
        i = _first_pending(rp, lo)
        if i >= 0:
            by_seq.setdefault(rp.c_seq[i], []).append((r, rp, i))
    for s, recs in sorted(by_seq.items()):
        waiters = [r for r, _, _ in recs]
        op = sigs[recs[0][1].c_sig[recs[0][2]]][S_NAME]
        t0 = min((t for r, rp, i in recs if (t := _at(rp.c_created[i], r, offs))), default=0)
        targets = [r for r, L in last.items() if L < s]
        out.waits.append(Wait(v, s, False, op, waiters, targets, list(v.missing), t0,
                              behind=max((last[r] for r in targets), default=None)))
    if v.missing:
        # every present member issued it and waits in it: the missing members are the suspects
        lo = min(last.values())
        pending: list[int] = []
        for _, rp in present:
            s = min(rp.last_enqueued_coll, lo)
            while s > rp.dropped_coll and (i := rp.slot(s)) >= 0 and rp.c_state[i] != COMPLETED:
                pending.append(s)
                s -= 1
        if pending:
            s = min(pending)
            waiters = [r for r, rp in present if (i := rp.slot(s)) >= 0 and rp.c_state[i] != COMPLETED]
            rp = v.per_rank[waiters[0]]
            i = rp.slot(s)
            out.waits.append(Wait(v, s, False, sigs[rp.c_sig[i]][S_NAME], waiters, [], list(v.missing),
                                  _at(rp.c_created[i], waiters[0], offs)))


def _first_pending(rp: RankPg, above: int) -> int:
    """Slot of the rank's oldest op above seq ``above`` that did not complete, or -1."""
    i = bisect_right(rp.c_seq, above)
    st = rp.c_state
    found = [k for k in (st.find(SCHEDULED, i), st.find(STARTED, i)) if k >= 0]
    return min(found) if found else -1


def _match_p2p(v: PgView, out: MatchResult, offs: dict[int, int]) -> None:
    """Pair the pending sends and recvs of each (src, dst); completed ones had a partner."""
    pending: dict[tuple[int, int], tuple[list[tuple], list[tuple]]] = {}
    any_source: list[tuple[int, tuple]] = []  # recv with no src (recvAnysource): peer -1
    any_p2p = False
    for r, rp in v.per_rank.items():
        for p in rp.p2ps:
            any_p2p = True
            if p[P_STATE] == COMPLETED or (p[P_PEER] < 0 and p[P_KIND] != "recv"):
                continue
            if p[P_PEER] < 0:
                any_source.append((r, p))
            elif p[P_KIND] == "send":
                pending.setdefault((r, p[P_PEER]), ([], []))[0].append(p)
            else:
                pending.setdefault((p[P_PEER], r), ([], []))[1].append(p)
            bl = out.blocked.setdefault(r, [])
            if not any(b.pg is v and b.p2p for b in bl):
                bl.append(Blocked(v, p[P_SEQ], p[P_NAME], True))
    if not any_p2p:
        return
    for r, p in sorted(any_source, key=lambda x: (x[0], x[1][P_SEQ])):
        # a pending send to r from anyone is its partner; else r waits for every other member
        key = next((k for k, (ss, rr) in sorted(pending.items()) if k[1] == r and len(ss) > len(rr)), None)
        if key is not None:
            pending[key][1].append(p)
            continue
        others = [x for x in v.per_rank if x != r]
        out.waits.append(Wait(v, p[P_SEQ], True, f"{p[P_NAME]} (any source)", [r], others, list(v.missing),
                              _at(p[P_CREATED], r, offs)))
    for (src, dst), (sends, recvs) in sorted(pending.items()):
        sends.sort(key=lambda p: p[P_SEQ])
        recvs.sort(key=lambda p: p[P_SEQ])
        for a, b in zip(sends, recvs):
            if a[P_SIZES] != b[P_SIZES]:
                out.mismatches.append(Mismatch(
                    v, a[P_SEQ], "size_mismatch", [(f"send {a[P_SIZES]}", [src]), (f"recv {b[P_SIZES]}", [dst])],
                    [src, dst], True, True, f"send/recv {src}->{dst}", _at(a[P_CREATED], src, offs), p2p=True))
        if len(sends) > len(recvs):
            extra = sends[len(recvs)]
            waiter, target = src, dst
        elif len(recvs) > len(sends):
            extra = recvs[len(sends)]
            waiter, target = dst, src
        else:
            continue
        t = _at(extra[P_CREATED], waiter, offs)
        if target in v.per_rank:
            out.waits.append(Wait(v, extra[P_SEQ], True, extra[P_NAME], [waiter], [target], [], t,
                                  state=extra[P_STATE]))
        elif target in v.missing:
            out.waits.append(Wait(v, extra[P_SEQ], True, extra[P_NAME], [waiter], [], [target], t,
                                  state=extra[P_STATE]))
