"""Program order: the rank that skipped a collective and went on.

All ranks run the same program (SPMD), so at the same point of it they have issued the same number of
ops in each of their groups *of the same role* (rank 1's TP group and rank 13's TP group are different
groups of one role, "mesh_tp"). A point of the program is an op (role, seq): the DP all_reduce with
seq 119 is the same point for every rank that has a DP group. A rank's program order is its
``record_id`` order (one counter per process, across all its groups).

A rank ``t`` that others wait for in op s of group P (it never issued it) skipped it if, after its last
op of P, it issued an op at some point where every other rank that reached the same point had issued
P's role up to seq s first. That deviation is named (``deviation``) instead of a cycle of waits: it
explains the others' waits. Those voters must run t's program: at t's own earlier points of that role
(PAST_POINTS of them), each had issued as many of P's role as t had; ranks whose roles legitimately
differ (pipeline stages issuing the same roles in another order) say nothing about t. Without such
evidence (no other rank reached a later point, they disagree among themselves, or their earlier steps
are not t's) nothing is inferred.

Roles: a group's ``desc`` less a trailing index (DeviceMesh names its groups ``mesh_<dim>``; groups built by
hand are often ``tp0``, ``tp1``), else, for groups with no
description (torch's "undefined"), the group's size and its place among the rank's groups of that
size in creation order. Roles are used only if they partition the ranks: two different groups of
one role must not share a rank; otherwise the groups of that role take no part.

Several ranks may deviate at once (independent faults): a voter that had not issued P's role up to s is
excused, not counted against t, when it is itself waited on in its own group of that role, for an op it never
issued; it is then named only if it is found to deviate in turn (each excuse is checked, until none is left
unchecked). Where no other rank reached t's later point (they all wait before it), t's own history decides:
at its PAST_POINTS earlier points of that role it and every rank at the same point had issued P's role in
lockstep (the same difference of seqs), and at the later point that lockstep says it should have issued seq s.
That history is not used for a rank that waits inside an op only for members that never entered it and do not
wait on it: a last step whose pattern differs from the earlier ones (an extra broadcast of a pair whose root hangs
before it) would make the root's peer a deviation, where it is only the root's victim.

Only ranks waited on while they are inside communication themselves are looked at (the ranks of a cycle, or
of a chain of waits), and only their few ops after the skipped one, against at most MAX_VOTERS other ranks:
the cost is small and paid only when there is a hang.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from .match import Wait
from .model import LoadResult, PgView, RankPg

MAX_VOTERS = 64  # other ranks compared at one point
MAX_LATER_OPS = 16  # ops of the deviating rank after the one it skipped, looked at in order
TAIL = 64  # newest ops of each rank's group that can be a point of comparison
PAST_POINTS = 3  # the accused rank's own earlier points at which the voters must have had its order
GENERIC_DESC = ("", "undefined")

Role = tuple


@dataclass
class Deviation:
    rank: int
    wait: Wait  # the op it skipped, that others wait in
    skipped_seq: int
    went_on: PgView  # the group of the op it issued instead
    went_on_seq: int
    went_on_op: str
    voters: list[int]  # ranks that reached the same point, each after the skipped op of their group of the role
    excused: list[int]  # ranks at that point before it too, each waited on there: deviations of their own

    def text(self) -> str:
        w = self.wait
        n = len(self.voters)
        if not n:
            return (f"rank {self.rank} issued {self.went_on_op} on pg {self.went_on.label} seq {self.went_on_seq} "
                    f"without the {w.op} on pg {w.pg.label} seq {self.skipped_seq} that, at its earlier steps, it and "
                    "every other rank issued before such an op (no other rank got this far)")
        who = f"every other rank at that point of the program ({n} ranks, " if n > 1 else f"rank {self.voters[0]} ("
        if self.excused:
            many = len(self.excused) > 1
            who = (f"every other rank at that point of the program but {'those' if many else 'the one'} named for "
                   f"skipping {'their' if many else 'its'} own ({n} ranks, ")
        return (f"rank {self.rank} issued {self.went_on_op} on pg {self.went_on.label} seq {self.went_on_seq} "
                f"without the {w.op} on pg {w.pg.label} seq {self.skipped_seq} that {who}each in its own group "
                "of that role) issued before it")


class Roles:
    """Group of each role on each rank."""

    def __init__(self, pgs: list[PgView]) -> None:
        by_rank: dict[int, list[PgView]] = {}
        for v in pgs:
            for r in v.per_rank:
                by_rank.setdefault(r, []).append(v)
        self.role_of: dict[tuple[int, int], Role] = {}  # (rank, id(view)) -> role
        self.group: dict[tuple[int, Role], PgView] = {}  # (rank, role) -> its group of that role
        claimed: dict[Role, dict[int, PgView]] = {}  # role -> rank -> group
        bad: set[Role] = set()
        seen: set[tuple[Role, int]] = set()  # (role, id(view)) whose members are claimed: once, not once a rank
        for r, views in by_rank.items():
            nth: dict[int, int] = {}
            for v in sorted(views, key=lambda v: (_name_key(v.name), v.ranks)):  # creation order
                if _generic(v):
                    k = nth.get(len(v.ranks), 0)
                    nth[len(v.ranks)] = k + 1
                    role: Role = ("n", len(v.ranks), k)
                else:
                    role = ("d", _role_name(v.desc), len(v.ranks))
                self.role_of[(r, id(v))] = role
                if (role, id(v)) in seen:
                    continue
                seen.add((role, id(v)))
                for m in v.ranks:
                    got = claimed.setdefault(role, {}).get(m)
                    if got is None:
                        claimed[role][m] = v
                    elif got is not v:
                        bad.add(role)  # two groups of one role share a rank: not a partition
        for (r, vid), role in list(self.role_of.items()):
            if role in bad:
                del self.role_of[(r, vid)]
        # point (role, seq) -> ranks that issued it, among each group's newest TAIL ops, ascending
        self.reached: dict[tuple[Role, int], list[int]] = {}
        for r, views in sorted(by_rank.items()):
            for v in views:
                role = self.role_of.get((r, id(v)))
                if role is not None:
                    self.group[(r, role)] = v
                    for q in v.per_rank[r].c_seq[-TAIL:]:
                        self.reached.setdefault((role, q), []).append(r)


def _role_name(desc: str) -> str:
    """A description with its group's index dropped: groups built by hand are often told apart by one
    (``tp0``, ``tp1``, ``mesh_dp_3``), where DeviceMesh gives every group of a dimension the same name. The
    role is used only if its groups partition the ranks, and a rank is named only where its own history
    agrees with the voters'."""
    stem = desc.rstrip("0123456789")
    return stem.rstrip("_-") if stem and stem != desc else desc


def _generic(v: PgView) -> bool:
    return v.desc in GENERIC_DESC or v.desc == v.name


def _name_key(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)


def _record_of(rp: RankPg, seq: int) -> int | None:
    i = rp.slot(seq)
    return rp.c_record[i] if i >= 0 else None


def _count_before(rp: RankPg, record: int) -> int | None:
    """The seq of the rank's newest op of this group issued before ``record`` (0: none), None if unknown."""
    i = bisect_left(rp.c_record, record)
    if i > 0:
        return rp.c_seq[i - 1]
    if rp.dropped_coll > 0:  # older history is gone: it may have had ops before
        return None
    return 0


def deviations(res: LoadResult, pgs: list[PgView], cands: list[int], out_edges: dict[int, list[Wait]],
               in_edges: dict[int, list[Wait]]) -> dict[int, Deviation]:
    """The ranks of ``cands`` (waited on, and inside communication) that skipped an op others wait in and went
    on, with the evidence. A deviation that leans on excused voters stands only if each of them deviates too."""
    if not cands:
        return {}
    roles = Roles(pgs)
    # ranks others wait for in a collective they never issued: as voters, they may have deviated themselves
    suspects: dict[int, set[int]] = {}  # rank -> ids of the groups it is waited on in
    for t in cands:
        for w in in_edges.get(t, ()):
            if not w.p2p:
                suspects.setdefault(t, set()).add(id(w.pg))
    found: dict[int, Deviation] = {}
    for t in cands:
        own_history = not _waits_only_on_others(t, out_edges, in_edges)
        for w in sorted(in_edges.get(t, ()), key=lambda w: (w.t_created, w.pg.name, w.seq)):
            if w.p2p:
                continue
            d = _skipped(roles, t, w, suspects, own_history)
            if d is not None:
                found[t] = d
                break
    while True:  # excuses that no deviation of their own backs: those votes count against, the inference falls
        bad = [t for t, d in found.items() if not set(d.excused) <= set(found)]
        if not bad:
            return found
        for t in bad:
            del found[t]


def _waits_only_on_others(t: int, out_edges: dict[int, list[Wait]], in_edges: dict[int, list[Wait]]) -> bool:
    """Whether ``t`` waits inside an op for members that never entered it (or left no dump), none of whom waits on
    ``t``, directly or through others. Then ``t`` is where it is because of them: a rank that skipped an op and went
    on waits in its later op for the ranks it left behind (they wait on it), not only for ranks stopped elsewhere."""
    mine = [w for w in out_edges.get(t, ()) if w.targets or w.missing_targets]
    if not mine:
        return False
    behind: set[int] = set()  # ranks whose waits lead to t
    todo = [t]
    while todo:
        for w in in_edges.get(todo.pop(), ()):
            for r in w.waiters:
                if r not in behind:
                    behind.add(r)
                    todo.append(r)
    return not any(r in behind for w in mine for r in (*w.targets, *w.missing_targets))


def _skipped(roles: Roles, t: int, w: Wait, suspects: dict[int, set[int]], own_history: bool = True) -> Deviation | None:
    v = w.pg
    rp_t = v.per_rank.get(t)
    role_p = roles.role_of.get((t, id(v)))
    if rp_t is None or role_p is None or not len(rp_t.c_record):
        return None
    s = w.seq
    last = rp_t.last_enqueued_coll
    if last >= s:
        return None
    r_last = _record_of(rp_t, last) if last > 0 else -1
    if r_last is None:
        return None
    # t's ops after its last op of v, oldest first
    later: list[tuple[int, PgView, int, int]] = []  # (record, view, seq, slot)
    for (r, role), g in roles.group.items():
        if r != t or g is v:
            continue
        rp = g.per_rank[t]
        i = bisect_left(rp.c_record, r_last + 1)
        for k in range(i, min(len(rp.c_seq), i + MAX_LATER_OPS)):
            later.append((rp.c_record[k], g, rp.c_seq[k], k))
    later.sort(key=lambda x: x[0])
    for rec, g, q, k in later[:MAX_LATER_OPS]:
        role_q = roles.role_of.get((t, id(g)))
        if role_q is None:
            continue
        mine = _count_before(rp_t, rec)
        if mine is None or mine >= s:
            continue
        # the other ranks at the same point: had they issued seq s of their group of P's role before it?
        after: list[int] = []
        before: list[int] = []
        excused: list[int] = []
        for u in roles.reached.get((role_q, q), ()):
            if len(after) + len(before) + len(excused) >= MAX_VOTERS:
                break
            if u == t:
                continue
            gq = roles.group.get((u, role_q))
            gp = roles.group.get((u, role_p))
            if gq is None or gp is None:
                continue
            rec_u = _record_of(gq.per_rank[u], q)
            if rec_u is None:
                continue
            c = _count_before(gp.per_rank[u], rec_u)
            if c is None:
                continue
            if c >= s:
                after.append(u)
            elif id(gp) in suspects.get(u, ()):
                excused.append(u)  # waited on in its own group of P's role: it may have skipped too
            else:
                before.append(u)
        if after and before:  # the others disagree among themselves: no program order to go by
            return None
        if after:
            if not _same_program(roles, rp_t, g.per_rank[t], k, role_q, role_p, after):
                return None  # t's own earlier steps do not follow the voters' order: roles differ (pipeline stages)
            sig = g.per_rank[t].sigs[g.per_rank[t].c_sig[k]]
            return Deviation(t, w, s, g, q, sig[0], after, excused)
        if before or excused:
            continue  # every other rank here was behind seq s too: t did not deviate yet, look further
        # nobody else reached this point (they wait before it): t's own lockstep history, if the others share it;
        # not where t waits only for ranks stopped elsewhere (own_history False): its history may be a step that
        # differs from the earlier ones, and what it waits for explains where it is
        if own_history and _lockstep_says(roles, rp_t, g.per_rank[t], k, role_q, role_p, s):
            sig = g.per_rank[t].sigs[g.per_rank[t].c_sig[k]]
            return Deviation(t, w, s, g, q, sig[0], [], [])
    return None


def _lockstep_says(roles: Roles, rp_p: RankPg, rp_q: RankPg, k: int, role_q: Role, role_p: Role, s: int) -> bool:
    """Whether, at t's PAST_POINTS points of role_q before slot ``k``, t had issued its group of role_p in lockstep
    (seq of role_q less count of role_p the same each time), every other rank that holds the same point had the
    same count, at least one did, and that lockstep puts seq ``s`` of role_p before t's point at slot ``k``."""
    deltas: set[int] = set()
    compared = False
    for kk in range(k - 1, k - 1 - PAST_POINTS, -1):
        if kk < 0:
            return False
        mine = _count_before(rp_p, rp_q.c_record[kk])
        if mine is None:
            return False
        q = rp_q.c_seq[kk]
        deltas.add(q - mine)
        for u in roles.reached.get((role_q, q), ())[:MAX_VOTERS]:
            gq = roles.group.get((u, role_q))
            c = None if gq is None or gq.per_rank.get(u) is rp_q else _voter_count(roles, u, role_q, role_p, q)
            if c is None:
                continue
            if c != mine:
                return False
            compared = True
    if not compared or len(deltas) != 1:
        return False
    return rp_q.c_seq[k] - deltas.pop() >= s


def _voter_count(roles: Roles, u: int, role_q: Role, role_p: Role, q: int) -> int | None:
    """How many ops of its group of role_p rank u had issued before its op ``q`` of role_q; None if unknown."""
    gq, gp = roles.group.get((u, role_q)), roles.group.get((u, role_p))
    if gq is None or gp is None:
        return None
    rec_u = _record_of(gq.per_rank[u], q)
    return _count_before(gp.per_rank[u], rec_u) if rec_u is not None else None


def _same_program(roles: Roles, rp_p: RankPg, rp_q: RankPg, k: int, role_q: Role, role_p: Role,
                  voters: list[int]) -> bool:
    """Whether the voters run t's program: at t's own PAST_POINTS points of role_q before slot ``k``, each voter
    that holds the same point had issued as many ops of its group of role_p as t had. Ranks of different
    programs (pipeline stages that issue the same roles in different orders) vote nothing about t. False when
    nothing could be compared: a deviation is named only on evidence."""
    compared = False
    for kk in range(k - 1, max(k - 1 - PAST_POINTS, -1), -1):
        mine = _count_before(rp_p, rp_q.c_record[kk])
        if mine is None:
            continue
        q = rp_q.c_seq[kk]
        for u in voters:
            c = _voter_count(roles, u, role_q, role_p, q)
            if c is None:
                continue
            if c != mine:
                return False
            compared = True
    return compared
