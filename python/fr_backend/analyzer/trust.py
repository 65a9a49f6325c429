"""States a dump's structure contradicts: torch's gloo recorder (and torch 2.15's hook-based one) leaves every
entry 'scheduled', so a state is taken from pg_status last_completed_collective, which counts an op as
completed once it finished, failed ops included. A collective that every member must join cannot have
completed on one member while another member's dump shows it never issued it: where that happens, the
completion is the state's word against what the ranks issued, and what was issued wins. The op is then
taken as not completed (the rank waits in it, as far as anyone can tell), and a note names the states
that were distrusted. Likewise a mismatch with no majority in its group (one rank of a pair against the
other) is judged from what the program issued elsewhere: the other groups of the same role (settle_ties).
"""

from __future__ import annotations

from bisect import bisect_left

from .dumpfile import shown
from .fmt import rank_word, ranks_str
from .match import MatchResult
from .model import COMPLETED, S_DTYPES, S_NAME, S_NAMES, S_SIZES, SCHEDULED, LoadResult, RankPg, RankSummary
from .order import Roles
from .ops import canonical, split_name

# Which signature field a mismatch is about (an op mismatch lists each side by its op's display name).
_KIND_KEY = {"op_mismatch": S_NAME, "size_mismatch": S_SIZES, "dtype_mismatch": S_DTYPES}

# Ops whose root (or the non-roots) may finish without every member having issued them: a broadcast root's
# sends can be buffered, a reduce or gather contributor's too. Their completion proves nothing about the others.
ROOTED = frozenset({"broadcast", "reduce", "scatter", "gather", "send", "recv"})


def _needs_everyone(names_key: str) -> bool:
    """Whether an op (or each op of a coalesced group, ``names_key`` joined by ',') completes only once every
    member issued it."""
    return not any(canonical(split_name(n)[0]) in ROOTED for n in str(names_key).split(","))


def _disagree(held: dict[int, RankPg], q: int) -> bool:
    """Whether the members that issued seq ``q`` issued different ops (names, sizes or dtypes that must agree):
    such a collective fails, whatever a state says."""
    keys = set()
    for rp in held.values():
        i = rp.slot(q)
        if i >= 0:
            keys.add(rp.sigs[rp.c_sig[i]][S_NAMES:S_DTYPES + 1])
    return len(keys) > 1


def distrust_contradicted(ranks: dict[int, RankSummary]) -> list[str]:
    """Take back the completions (from pg_status, on ranks whose states are untrusted) of collectives that a
    member of the group never issued; the notes that say which, one per group."""
    groups: dict[tuple[str, tuple[int, ...]], dict[int, RankPg]] = {}  # one group: its name and members
    for r, s in ranks.items():
        for rp in s.pgs.values():
            groups.setdefault((rp.name, rp.ranks), {})[r] = rp
    notes: list[str] = []
    for (name, members_t), held in groups.items():
        if not any(rp.untrusted_states for rp in held.values()) or len(held) < 2:
            continue
        members = set(members_t) or set(held)
        issued = {r: rp.last_enqueued_coll for r, rp in held.items() if r in members}
        if len(issued) < 2:
            continue
        lo = min(issued.values())
        doubted: dict[int, list[int]] = {}  # rank -> seqs whose completion is taken back
        absent: set[int] = set()
        # per seq, worked out once for all the group's ranks (the default group has every rank of the job)
        never_at: dict[int, list[int]] = {}
        differ_at: dict[int, bool] = {}
        for r, rp in held.items():
            if not rp.untrusted_states or r not in issued:
                continue
            states = bytearray(rp.c_state)
            # from the newest op every member issued on: an op all members went past is not where one failed
            for i in range(bisect_left(rp.c_seq, lo), len(rp.c_seq)):
                q = rp.c_seq[i]
                if states[i] != COMPLETED or not _needs_everyone(rp.sigs[rp.c_sig[i]][S_NAMES]):
                    continue
                never = never_at.get(q)
                if never is None:
                    never = never_at[q] = [m for m, last in issued.items() if last < q]
                if not never and q not in differ_at:
                    differ_at[q] = _disagree(held, q)
                if never or differ_at[q]:
                    states[i] = SCHEDULED
                    doubted.setdefault(r, []).append(q)
                    absent.update(never)
            if r in doubted:
                rp.c_state = bytes(states)
                rp.last_completed_coll = min(rp.last_completed_coll, doubted[r][0] - 1)
                lop = ranks[r].last_op
                if lop is not None and lop.pg == rp.name and lop.seq in doubted[r]:
                    lop.state = SCHEDULED
        if doubted:
            by_seqs: dict[tuple[int, ...], list[int]] = {}  # the same seqs of many ranks: said once
            for r, qs in sorted(doubted.items()):
                by_seqs.setdefault(tuple(qs), []).append(r)
            which = "; ".join(f"{rank_word(rs)} seq {ranks_str(qs)}" for qs, rs in by_seqs.items())
            one = len({q for qs in doubted.values() for q in qs}) == 1
            why = (f"{rank_word(sorted(absent))} never issued {'it' if one else 'them'}" if absent
                   else "its members issued different ops")
            notes.append(f"pg {shown(name)}: states distrusted: pg_status says {which} completed, but {why} (a "
                         "collective completes only once every member issued the same op): judged from what each "
                         "rank issued, taken as not completed")
    return notes


def settle_ties(res: LoadResult, m: MatchResult) -> None:
    """A mismatch with no majority inside its group (a pair: one rank against the other) is judged from what
    the program issued: where the other groups of the same role (SPMD peers, e.g. the other pairs) issued, at
    the same seq, the op of one side, all alike, the other side is the one that differs. Said in a note; with
    no such groups, or ones that disagree among themselves, the tie stays (every side a suspect)."""
    ties = [mm for mm in m.mismatches if mm.tie and not mm.p2p and not mm.deciders]
    if not ties:
        return
    roles = Roles(m.pgs)
    for mm in ties:
        v, idx = mm.pg, _KIND_KEY[mm.kind]
        r0 = next(iter(v.per_rank), None)
        role = roles.role_of.get((r0, id(v))) if r0 is not None else None
        if role is None:
            continue
        peers = {id(w): w for (r, ro), w in roles.group.items() if ro == role and w is not v}.values()
        votes = set()
        for w in peers:
            for rp in w.per_rank.values():
                if (i := rp.slot(mm.seq)) >= 0:
                    votes.add(res.sigs[rp.c_sig[i]][idx])
        if len(votes) != 1:
            continue
        vote = votes.pop()
        agree = [rs for value, rs in mm.groups if value == vote]
        if len(agree) != 1:
            continue
        mm.culprits = sorted(r for _, rs in mm.groups if rs is not agree[0] for r in rs)
        mm.tie = False
        others = sorted({r for w in peers for r in w.per_rank})
        res.notes.append(f"pg {shown(v.name)} seq {mm.seq}: {mm.kind.replace('_', ' ')} with no majority in the "
                         f"group; the other groups of its role ({rank_word(others)}) issued at that seq what "
                         f"{rank_word(agree[0])} issued: {rank_word(mm.culprits)} differs")
