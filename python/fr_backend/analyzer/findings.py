"""Turn match evidence into findings, root cause first.

Blame rules:
  * A rank that waits inside a collective or p2p is never a culprit of a hang by itself.
  * Waiting forms a graph: waiter -> member that never issued the op. Following it ends at
    a rank that is not inside any communication: that rank is the culprit (not_joined or
    p2p_unmatched); every rank on the way is a victim.
  * A chain that ends in a rank stuck inside an op every member issued is reported as
    ``stuck`` (no one to blame from the dumps); a chain that loops is a ``deadlock``, unless
    the record order shows p2p ops posted asynchronously (a rank inside a collective it issued after
    them: they do not block it) and a rank of the loop whose only pending ops are p2p ops waiting for
    such a rank of the same group is outside torch.distributed (it went on too: the culprit), or the
    program order (order.py) shows a rank that skipped the op the others wait in and went on: that rank
    is the culprit (``not_joined``), or one rank alone left the loop for a closing op that no other member
    reached while every other wait leads to it (leaver.py, ``left_early``). A user-frame stack alone frees
    no rank (``work.wait()`` shows only its caller), and freeing never leaves a cycle without a fault.
  * Stragglers (stragglers.py) are performance findings, measured on arrival times corrected by each clock's
    estimated offset (clock.py), and only beyond the offsets' uncertainty.
  * A chain that ends in a rank waiting for a member whose dump is missing ends at that member:
    ``missing_dump`` names it the likely culprit, every rank on the way a victim.
  * Mismatches blame the minority; with no majority (a tie) every side is named, unless members
    of the PG left no dump: they would break the tie, so the finding names no culprit (ambiguous).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .fmt import ms, rank_word, ranks_str, sizes_str
from .match import Blocked, MatchResult, Mismatch, Stall, Wait
from .model import (COMPLETED, P_CREATED, P_KIND, P_NAME, P_PEER, P_RECORD, P_SEQ, P_STATE,
                    STATE_NAMES, Finding, LoadResult, PgView)
from .leaver import EarlyExit, early_exit
from .order import Deviation, deviations
from .outside import also_not_in, outside_findings
from .stragglers import Options, straggler_findings

# order of the tiers: the first finding is the most likely root cause
TIER = {"left_with_exception": -1, "hang_mismatch": 0, "not_joined": 1, "p2p_unmatched": 1, "left_early": 1,
        "deadlock": 2, "stuck": 2, "suspect_missing": 3, "mismatch": 4, "straggler": 5, "info": 6,
        "outside_collectives": 2}
STACK_LINES = 60


def analyze(res: LoadResult, m: MatchResult, opts: Options | None = None) -> list[Finding]:
    opts = opts or Options()
    ranked: list[tuple[int, int, Finding]] = []
    ranked += _hang_findings(res, m)
    ranked += _mismatch_findings(res, m)
    ranked += [(TIER["straggler"], key, f) for key, f in straggler_findings(m, opts)]
    ranked += _info_findings(res, m, {r for _, _, f in ranked if f.kind == "missing_dump" for r in f.culprit_ranks})
    ranked += _exit_findings(res, m, [f for _, _, f in ranked])
    ranked = _unless_explained_by_exit(ranked)
    ranked += [(TIER["outside_collectives"], 0, f) for f in outside_findings(res, [f for _, _, f in ranked])]
    ranked.sort(key=lambda t: (t[0], t[1]))
    return [f for _, _, f in ranked]


def _unless_explained_by_exit(ranked: list[tuple[int, int, Finding]]) -> list[tuple[int, int, Finding]]:
    """A ``stuck`` op found in flight on dumps taken as a rank left the job is so only because that rank's
    leaving explains the rest: where no left_with_exception finding of its group does, it is a fault again."""
    explained = {f.pg for _, _, f in ranked if f.kind == "left_with_exception"}
    out = []
    for tier, key, f in ranked:
        if f.kind == "stuck" and f.severity == "info" and LEFT_IN_FLIGHT in f.detail and f.pg not in explained:
            f.detail = f.detail.split(": not a fault by itself. ", 1)[-1]
            f.severity = "fault"
            tier = TIER["stuck"]
        out.append((tier, key, f))
    return out


# --------------------------------------------------------------------------- ranks that left with an exception


EXIT_TRACEBACK_LINES = 12


def _exit_findings(res: LoadResult, m: MatchResult, found: list[Finding]) -> list[tuple[int, int, Finding]]:
    """A rank whose dump says it was leaving the job with an uncaught exception (it wrote its part on the
    way out), that did not wait in an op for others, and that a peer waits for in an op it never issued:
    that exception is the root cause, named before the hang it leaves behind. A note on a rank nobody waits
    for explains no hang: the other findings decide. With several, the earliest exception comes first. The
    op, group and seq are those of the hang finding that blames the rank, if any; its victims are the ranks
    that wait for it there."""
    waiting = {r for w in m.waits for r in w.waiters}
    left: list[tuple[int, int, Finding]] = []
    for r, s in sorted(res.ranks.items()):
        if s.exit is None or r in waiting:
            continue  # a rank that raised while it waited for others left because of them
        waited_by = {w for wt in m.waits if r in wt.targets for w in wt.waiters}
        if not waited_by:
            continue
        blamed = next((f for f in found if r in f.culprit_ranks and f.is_fault), None)
        # a peer still finishing an earlier op of that group (in flight) waits for it next
        behind = sorted({x for f in found if blamed is not None and f.pg == blamed.pg and f.severity == "info"
                         and f.detail.startswith(IN_FLIGHT) for x in f.ranks} - waited_by - {r})
        waiters = sorted(waited_by | set(blamed.victims if blamed else ()) | set(behind))
        where = f"host {s.hostname or '?'}, pid {s.pid if s.pid is not None else '?'}"
        detail = f"rank {r} ({where}) left the job with {s.exit.one_line()}; {rank_word(waiters)} waited for it"
        if blamed is not None and blamed.op:
            seq = f" (seq {blamed.collective_seq_id})" if blamed.collective_seq_id is not None else ""
            detail += f" in {blamed.op}{seq} on pg {blamed.pg}" + (f" ({blamed.pg_desc})" if blamed.pg_desc else "")
        detail += also_not_in(res, min((wt for wt in m.waits if r in wt.targets), key=lambda wt: wt.t_created))
        evidence = [f"{rank_word(behind)}: still inside an earlier op of pg {blamed.pg} (in flight), next in line to "
                    "wait for it"] if blamed is not None and behind else []
        evidence += [f"rank {r} traceback, innermost last:"] + [
            "  " + line for line in s.exit.traceback.splitlines()[-EXIT_TRACEBACK_LINES:]]
        f = Finding("left_with_exception", blamed.pg if blamed else "", blamed.pg_desc if blamed else "",
                    blamed.collective_seq_id if blamed else None, blamed.op if blamed else "", [r], detail,
                    "fault", evidence, waiters)
        if blamed is not None:
            f.p2p_seq_id = blamed.p2p_seq_id
        left.append((s.exit.time_ns, r, f))
    left.sort(key=lambda t: (t[0], t[1]))
    return [(TIER["left_with_exception"], i, f) for i, (_, _, f) in enumerate(left)]


# --------------------------------------------------------------------------- hangs


@dataclass
class _Graph:
    """Who waits on whom: waiter -> member that never issued the op (or posted the partner)."""

    out_edges: dict[int, list[Wait]]
    in_edges: dict[int, list[Wait]]
    culprits: list[int]  # waited on, not inside any communication
    stuck: list[int]  # waited on, inside an op and waiting on nobody
    explained: list[int]  # waited on, inside a mismatched op or one that waits for a missing dump
    cyc: list[int]  # waiting, and the chain never ends at one of the above

    def victims_of(self, roots: list[int] | set[int], stop: set[int] | frozenset[int] = frozenset()) -> set[int]:
        """The ranks whose waits lead to ``roots``, not through a rank of ``stop`` (another culprit: what waits on
        it is that culprit's)."""
        seen: set[int] = set()
        todo = list(roots)
        while todo:
            t = todo.pop()
            for w in self.in_edges.get(t, ()):
                for r in w.waiters:
                    if r not in seen and r not in stop:
                        seen.add(r)
                        todo.append(r)
        return seen


def _graph(m: MatchResult, waits: list[Wait], blocked: dict[int, list[Blocked]]) -> _Graph:
    out_edges: dict[int, list[Wait]] = {}
    in_edges: dict[int, list[Wait]] = {}
    for w in waits:
        for r in w.waiters:
            out_edges.setdefault(r, []).append(w)
        for t in w.targets:
            in_edges.setdefault(t, []).append(w)
    mm_blocked = {r for mm in m.mismatches if mm.hanging for _, rs in mm.groups for r in rs}
    # Ranks inside an op that waits for a member whose dump is missing: their chain ends at that member,
    # whom the missing_dump finding names, so they are neither stuck by themselves nor in a cycle.
    wait_on_missing = {r for w in m.waits if w.missing_targets for r in w.waiters}
    culprits = sorted(t for t in in_edges if t not in blocked)
    stuck = sorted(t for t in in_edges if t in blocked and t not in out_edges and t not in mm_blocked
                   and t not in wait_on_missing)
    explained = sorted(t for t in in_edges if t in blocked and t not in out_edges
                       and (t in mm_blocked or t in wait_on_missing))
    g = _Graph(out_edges, in_edges, culprits, stuck, explained, [])
    ends = set(culprits) | set(stuck) | set(explained)
    reach = g.victims_of(ends) | ends
    g.cyc = sorted(r for r in out_edges if r not in reach)
    return g


def _hang_findings(res: LoadResult, m: MatchResult) -> list[tuple[int, int, Finding]]:
    out: list[tuple[int, int, Finding]] = []
    blocked = m.blocked
    waits = [w for w in m.waits if w.targets]
    g = _graph(m, waits, blocked)
    if g.cyc:
        # one rank left the loop for a closing op and every other wait leads to it (leaver.py): it explains the cycle
        left = early_exit(res.world_size, set(res.ranks), m.waits, blocked,
                          bool(m.stalls) or any(mm.hanging for mm in m.mismatches))
        if left is not None:
            return [_early_exit_finding(res, left, blocked)]
    notes: dict[int, list[str]] = {}  # culprit -> why it is one although it looked blocked
    if g.cyc:
        # p2p ops shown to be posted asynchronously do not block their ranks (see _async_p2p)
        went_on, freed = _async_p2p(res, g.cyc, blocked, waits)
        if went_on:
            blocked2 = {r: b for r, b in blocked.items() if r not in freed}
            waits2 = [w for w in waits if not (w.p2p and set(w.waiters) <= set(went_on))
                      and not set(w.waiters) <= set(freed)]
            g2 = _graph(m, waits2, blocked2)
            # freeing must leave the freed ranks as the culprits it found, and a fault: else the cycle stays
            if set(freed) <= set(g2.culprits) and (g2.culprits or g2.stuck or g2.explained or g2.cyc):
                for r, line in freed.items():
                    notes[r] = [line]
                blocked, waits, g = blocked2, waits2, g2
    # Ranks that skipped an op the others issued, and went on: each deviation is a culprit of its own, whether
    # it closes a cycle or sits in a chain of waits that ends at another culprit (independent faults).
    skipped: dict[int, Deviation] = {}
    cands = sorted(set(g.cyc) | {t for t in g.in_edges if t in blocked})
    dev = deviations(res, m.pgs, cands, g.out_edges, g.in_edges) if cands else {}
    if dev:
        if g.cyc and not set(g.cyc) <= g.victims_of(set(dev)) | set(dev):
            dev = {t: d for t, d in dev.items() if t not in g.cyc}  # the cycle stays: a deviation explains it not
        skipped = dev
        g.culprits = sorted(set(g.culprits) | set(dev))
        reach = g.victims_of(set(dev)) | set(dev)
        g.cyc = [r for r in g.cyc if r not in reach]
    out_edges, in_edges, culprits, stuck = g.out_edges, g.in_edges, g.culprits, g.stuck
    # what waits on a culprit is that culprit's doing: chains stop at every culprit, and no culprit is a victim
    faulty = set(culprits) | {r for mm in m.mismatches if mm.hanging for r in mm.culprits}

    def victims_of(roots: list[int] | set[int]) -> set[int]:
        return g.victims_of(roots, faulty - set(roots))

    # group culprits by the op most of their waiters are in
    def primary(t: int) -> Wait:
        if t in skipped:
            return skipped[t].wait
        # the oldest op it left others waiting in: where the trouble started
        return sorted(in_edges[t], key=lambda w: (w.t_created, -len(w.waiters), w.pg.name, w.seq))[0]

    groups: dict[int, tuple[Wait, list[int]]] = {}
    for c in culprits:
        w = primary(c)
        groups.setdefault(id(w), (w, []))[1].append(c)
    for w, cs in groups.values():
        victims = sorted(victims_of(cs) - set(cs))
        kind = "p2p_unmatched" if w.p2p else "not_joined"
        if w.p2p:
            detail = (f"{rank_word(cs)} never posted the partner of {w.op} (pg {w.pg.label}, p2p seq {w.seq}): "
                      f"{_waiting(w)}")
        else:
            detail = (f"{rank_word(cs)} never issued {w.op} (pg {w.pg.label}, seq {w.seq}); "
                      f"{_waiting(w, count=True)}")
            if w.behind is not None and w.behind < w.seq - 1:
                detail += (f"; {rank_word(cs)} issued nothing in this group after seq {w.behind}, "
                           f"{w.seq - 1 - w.behind} seq{'s' if w.seq - 1 - w.behind != 1 else ''} before it")
        for c in cs:
            if c in skipped:
                detail += f"; {skipped[c].text()}, and waits there"
        indirect = sorted(set(victims) - set(w.waiters))
        if indirect:
            detail += (f"; {len(indirect)} more rank{'s wait' if len(indirect) != 1 else ' waits'} on those through "
                       "other groups")
        ev = [ln for c in cs for ln in notes.get(c, ())]
        ev += _chain_lines(cs, in_edges, blocked) + _culprit_lines(res, cs, blocked, inside=set(skipped) | set(notes))
        f = Finding(kind, w.pg.name, w.pg.desc, None if w.p2p else w.seq, w.op, cs, detail, "fault", ev, victims)
        if w.p2p:
            f.p2p_seq_id = w.seq
        ops = [(x.pg, x.seq, x.p2p, x.waiters) for c in cs for x in in_edges[c]]
        out.append(_demoted_if_in_flight(res, f, ops) or (TIER[kind], w.t_created, f))

    # ranks stuck inside an op every member issued: one finding per op, not one per rank
    stalls = {(id(st.pg), st.seq): st for st in m.stalls}
    stuck_in: dict[tuple[int, int, bool], tuple[Blocked, list[int]]] = {}
    for t in stuck:
        b = next((x for x in blocked[t] if not x.p2p and (id(x.pg), x.seq) in stalls), blocked[t][0])
        stuck_in.setdefault((id(b.pg), b.seq, b.p2p), (b, []))[1].append(t)
    for (pg_id, seq, p2p), (b, ts) in stuck_in.items():
        st = None if p2p else stalls.pop((pg_id, seq), None)
        if st is not None:
            out.append(_stall_finding(res, st, in_edges, blocked, victims_of))
            continue
        waiters = sorted({r for t in ts for w in in_edges[t] for r in w.waiters})
        detail = (f"{rank_word(ts)} {'is' if len(ts) == 1 else 'are'} stuck inside {b.op} (pg {b.pg.label}, "
                  f"{'p2p ' if b.p2p else ''}seq {b.seq}) which every member issued, and {rank_word(waiters)} "
                  f"wait{'s' if len(waiters) == 1 else ''} for {'it' if len(ts) == 1 else 'them'}; the op itself "
                  "does not finish (network, device or library fault); the dumps name no rank that skipped it")
        f = Finding("stuck", b.pg.name, b.pg.desc, None if b.p2p else b.seq, b.op, [], detail, "fault",
                    _chain_lines(ts, in_edges, blocked), sorted(victims_of(ts)))
        f.ranks = sorted(ts)
        ops = [(x.pg, x.seq, x.p2p, [t]) for t in ts for x in blocked[t]]
        out.append(_demoted_if_in_flight(res, f, ops) or (TIER["stuck"], 0, f))
    # every member inside one collective and nobody waiting on a rank that skipped something: the hang is
    # that op (unless a rank inside it also waits elsewhere: the chain from there explains it)
    for st in stalls.values():
        if not any(r in out_edges for r in st.inside):
            out.append(_stall_finding(res, st, in_edges, blocked, victims_of))

    # cycles: waiters that never reach a rank outside communication nor a mismatch
    cyc = g.cyc
    if cyc:
        lines = []
        for r in cyc[:16]:
            w = out_edges[r][0]
            lines.append(_wait_line(w, [r], rank_word(w.targets)))
        w0 = out_edges[cyc[0]][0]
        if any(w.p2p for r in cyc for w in out_edges[r]):
            why = ("they issued p2p ops and collectives (or sends and recvs) in orders that cannot all progress: "
                   "each waits for an op the other issues only later")
        else:
            why = "they issue collectives of different groups in different orders"
        f = Finding("deadlock", w0.pg.name, w0.pg.desc, None if w0.p2p else w0.seq, w0.op, cyc,
                    f"{rank_word(cyc)} wait on each other in a cycle: {why}", "fault", lines, [])
        if w0.p2p:
            f.p2p_seq_id = w0.seq
        ops = [(x.pg, x.seq, x.p2p, [r]) for r in cyc for x in out_edges[r]]
        out.append(_demoted_if_in_flight(res, f, ops) or (TIER["deadlock"], 0, f))

    # all present members wait: a missing rank is the suspect, unless the op they wait in is an
    # ambiguous mismatch: then the missing ranks are its deciding votes, reported with it
    seen: set[tuple[int, ...]] = set()
    undecided = {(id(mm.pg), mm.seq) for mm in m.mismatches if mm.ambiguous and not mm.p2p}
    for w in m.waits:
        if w.targets or not w.missing_targets or tuple(w.missing_targets) in seen:
            continue
        if not w.p2p and (id(w.pg), w.seq) in undecided:
            continue
        if any(r in in_edges or r in culprits for r in w.missing_targets):
            continue
        seen.add(tuple(w.missing_targets))
        there = [r for r in w.missing_targets if r in res.elsewhere]
        unknown = [r for r in w.missing_targets if r in res.undecided]
        if unknown:
            # several files claim a rank waited on, and none is known to be its own: no name rather than a wrong one
            detail = (f"{_wait_line(w, w.waiters, rank_word(w.missing_targets))}, and which dump is "
                      f"{rank_word(unknown)}'s cannot be told (several files claim it, see the note): no rank named")
            f = Finding("missing_dump", w.pg.name, w.pg.desc, None if w.p2p else w.seq, w.op, [], detail, "suspect",
                        _chain_lines(list(w.waiters), in_edges, blocked), sorted(w.waiters))
            f.ranks = sorted(w.missing_targets)
            out.append((TIER["suspect_missing"], w.t_created, f))
            continue
        if not there:
            why = "whose dump is missing: the likely culprit"
        elif len(there) == len(w.missing_targets):
            why = ("whose dumps are not in this incident but in sibling ones (see the note): analyse them together "
                   "to see where they were")
        else:
            why = (f"whose dump is missing: the likely culprit ({rank_word(there)} only in sibling incidents, see the "
                   "note)")
        detail = f"{_wait_line(w, w.waiters, rank_word(w.missing_targets))}, {why}"
        victims = victims_of(list(w.waiters)) | set(w.waiters)
        indirect = sorted(victims - set(w.waiters))
        if indirect:
            detail += (f"; {len(indirect)} more rank{'s wait' if len(indirect) != 1 else ' waits'} on "
                       f"{'them' if len(w.waiters) != 1 else 'it'} ({ranks_str(indirect)})")
        f = Finding("missing_dump", w.pg.name, w.pg.desc, None if w.p2p else w.seq, w.op, sorted(w.missing_targets),
                    detail, "suspect", _chain_lines(list(w.waiters), in_edges, blocked) +
                    _dumped_on_sigterm_lines(res, w.missing_targets), sorted(victims))
        out.append((TIER["suspect_missing"], w.t_created, f))
    return out


def _early_exit_finding(res: LoadResult, left: EarlyExit, blocked: dict[int, list[Blocked]]
                        ) -> tuple[int, int, Finding]:
    w = left.named
    ev = [_wait_line(x, x.waiters, rank_word(x.targets)) for x in [left.own, *left.peer_waits, *left.behind]]
    ev += _culprit_lines(res, [left.rank], blocked, inside={left.rank})
    f = Finding("left_early", w.pg.name, w.pg.desc, w.seq, w.op, [left.rank], left.detail(), "fault", ev, left.victims)
    ops = [(x.pg, x.seq, False, x.waiters) for x in [left.own, *left.peer_waits]]
    return _demoted_if_in_flight(res, f, ops) or (TIER["left_early"], w.t_created, f)


def _dumped_on_sigterm_lines(res: LoadResult, missing: list[int]) -> list[str]:
    """Tells the ranks a launcher stopped (their dump was written when SIGTERM reached them: reason sigterm)
    from the missing ones, which never dumped at all."""
    stopped = [r for r, s in res.ranks.items() if s.dump_reason == "sigterm"]
    lines = [f"rank {r} dumped when SIGTERM reached it ({res.ranks[r].dump_detail.split(', before ')[0]}): "
             "stopped by its launcher, not a rank without a dump" for r in stopped[:8]]
    if len(stopped) > 8:
        lines.append(f"{len(stopped) - 8} more ranks dumped when SIGTERM reached them")
    lines += [f"rank {r}: no dump at all, not even on SIGTERM (killed, crashed, or its dump failed)"
              for r in sorted(missing) if r not in res.elsewhere][:8]
    return lines


IN_FLIGHT_NS = 1_000_000_000  # on a dump taken on request, an op younger than this may just be running


def _stall_finding(res: LoadResult, st: Stall, in_edges: dict[int, list[Wait]], blocked: dict[int, list[Blocked]],
                   victims_of: Callable[[list[int]], set[int]]) -> tuple[int, int, Finding]:
    """One ``stuck`` finding for a collective every member issued and that does not finish. The states
    name a rank when they can: one that never started it while the others did, or the rank whose error
    triggered the dumps."""
    v = st.pg
    err = _error_rank(res)
    err = err if err is not None and err in v.ranks else None
    culprits = sorted(set(st.not_started) | ({err} if err is not None else set()))
    failed = [r for r in st.inside if st.seq in v.per_rank[r].failed]
    live = [r for r in st.inside if r not in failed]
    detail = f"every member of pg {v.label} issued {st.op} (seq {st.seq}) and it does not finish: " + "; ".join(
        ([f"{rank_word(live)} {'is' if len(live) == 1 else 'are'} still inside it"] if live else [])
        + ([f"on {rank_word(failed)} it failed"] if failed else []))
    if st.done:
        detail += f", {rank_word(st.done)} completed {'its' if len(st.done) == 1 else 'their'} part"
    if st.not_started:
        n = len(st.not_started)
        detail += (f"; {rank_word(st.not_started)} never started it (scheduled only, while the others started it): "
                   f"{'its' if n == 1 else 'their'} device or communication thread never reached the op (an earlier "
                   "kernel or op on its stream is stuck, or the process is)")
    if err is not None:
        why = res.ranks[err].dump_detail if err in res.ranks else ""
        detail += f"; rank {err} reported an error and triggered the dumps" + (f" ({why})" if why else "")
    if not culprits:
        detail += "; the dumps name no rank that skipped it (network, device or library fault)"
    inside = set(st.inside)
    outside = sorted(victims_of(st.inside) - inside)
    if outside:
        detail += (f"; {rank_word(outside)} wait{'s' if len(outside) == 1 else ''} on "
                   f"{'it' if len(st.inside) == 1 else 'them'} through other ops")
    victims = sorted((inside | set(outside)) - set(culprits))
    states = ([f"{rank_word(live)}: inside (not completed)"] if live else []) + \
        ([f"{rank_word(failed)}: failed in it (retired, not completed)"] if failed else []) + \
        ([f"{rank_word(st.done)}: completed {'its' if len(st.done) == 1 else 'their'} part"] if st.done else []) + \
        ([f"{rank_word(st.not_started)}: scheduled, never started"] if st.not_started else [])
    ev = states + _chain_lines(st.inside, in_edges, blocked) + _culprit_lines(res, culprits, blocked, outside=False)
    f = Finding("stuck", v.name, v.desc, st.seq, st.op, culprits, detail, "fault", ev, victims)
    f.ranks = sorted(inside | set(st.done))
    return (_demoted_if_in_flight(res, f, [(v, st.seq, False, st.inside)], others_done=bool(st.done))
            or (TIER["stuck"], st.t_created, f))


def _mismatch_evidence(res: LoadResult, mm: Mismatch) -> tuple[list[str], list[int]]:
    """Where each culprit issued the odd op (its caller), and the other members that wait in it (their op did
    not complete), or in whom it failed: (evidence lines, victims)."""
    lines: list[str] = []
    culprits = set(mm.culprits)
    value = {r: val for val, rs in mm.groups for r in rs}
    for c in mm.culprits[:8]:
        s = res.ranks.get(c)
        if s is None:
            continue
        where = f" on {s.hostname} pid {s.pid}" if s.hostname else ""
        frame = s.frames.get((mm.pg.name, mm.seq)) if not mm.p2p else None
        if frame is None and s.last_op is not None and s.last_op.pg == mm.pg.name and s.last_op.seq == mm.seq:
            frame = s.last_op.frame
        v = value.get(c, "")
        shown = sizes_str(v) if mm.kind == "size_mismatch" and not mm.p2p else v
        lines.append(f"rank {c}{where}: {shown} at {'p2p ' if mm.p2p else ''}seq {mm.seq}"
                     + (f", called from {frame}" if frame else ", caller not recorded"))
    waiting: list[int] = []
    failed: list[int] = []
    if mm.hanging and not mm.p2p:
        for r, rp in mm.pg.per_rank.items():
            if r in culprits or (i := rp.slot(mm.seq)) < 0 or rp.c_state[i] == COMPLETED:
                continue
            (failed if mm.seq in rp.failed else waiting).append(r)
    elif mm.hanging:  # a p2p pair: the side that is not named waits
        waiting = [r for _, rs in mm.groups for r in rs if r not in culprits]
    if waiting:
        lines.append(f"{rank_word(waiting)} wait{'s' if len(waiting) == 1 else ''} in it")
    if failed:
        lines.append(f"{rank_word(failed)}: it failed there")
    return lines, sorted(waiting + failed)


def _error_rank(res: LoadResult) -> int | None:
    """The rank named as trigger by the dumps written because of an error, when they agree on one."""
    trig = {s.trigger_rank for s in res.ranks.values()
            if s.dump_reason == "error" and s.trigger_rank is not None and s.trigger_rank >= 0}
    return trig.pop() if len(trig) == 1 else None


REQUESTED = frozenset({"manual", "signal", "teardown"})  # dump reasons of a job asked to dump, not failing


def _dump_reasons(res: LoadResult) -> set[str]:
    return {s.dump_reason for s in res.ranks.values()}


IN_FLIGHT = "in flight at dump time"  # how the detail of a hang finding made informational starts
LEFT_IN_FLIGHT = "on a dump taken as a rank left the job"


def _demoted_if_in_flight(res: LoadResult, f: Finding, ops: list[tuple[PgView, int, bool, list[int]]],
                          others_done: bool = False) -> tuple[int, int, Finding] | None:
    """On a dump taken on request (every rank's reason manual, signal or teardown), a hang finding whose ops had
    all been pending for less than their group's timeout on every rank waiting in them is the job's state in
    flight, not a fault: the finding, made informational (its ranks kept, none blamed). None otherwise. The same
    holds for a ``stuck`` finding that names no rank, on a dump taken as a rank left the job with an exception
    (nothing timed out: a peer still inside an op some members completed was only slower to finish it)."""
    # As a rank leaves, its peers wait for it for a reason: only an op that no rank is blamed for, which some
    # member completed, is in flight then (and only while that rank's leaving explains the rest:
    # _unless_explained_by_exit).
    requested = _dump_reasons(res) <= REQUESTED
    leaving = f.kind == "stuck" and others_done and not f.culprit_ranks
    age = _in_flight_age(res, ops) if requested or leaving else None
    if age is None:
        return None
    why = "on a dump taken on request" if requested else LEFT_IN_FLIGHT
    f.detail = f"{IN_FLIGHT} ({ms(age[0])} after it was issued, within {age[1]}, {why}): not a fault by itself. " + f.detail
    f.severity = "info"
    f.ranks = sorted(set(f.ranks) | set(f.culprit_ranks))
    f.culprit_ranks = []
    return TIER["info"], 0, f


def _in_flight_age(res: LoadResult, ops: list[tuple[PgView, int, bool, list[int]]]) -> tuple[int, str] | None:
    """(the oldest age, what bounded it) of ``ops`` (group, seq, p2p, the ranks pending in it) at dump time, when
    every dump was taken on request (or as a rank left the job) and each op, on each of those ranks, was younger
    than its group's timeout (IN_FLIGHT_NS where the dump gives none); else None. Measured on each rank's own clock (its dump time less its
    own creation time of the op), so no clock offset estimate enters it."""
    reasons = _dump_reasons(res)
    if not ops or not reasons or not reasons <= REQUESTED | {"exception"}:
        return None
    oldest = 0
    bound = ""
    for v, seq, p2p, ranks in ops:
        for r in ranks:
            s, rp = res.ranks.get(r), v.per_rank.get(r)
            if s is None or rp is None or not s.dump_time_ns:
                return None  # a rank whose age is unknown may be the old one
            if p2p:
                created = min((p[P_CREATED] for p in rp.p2ps if p[P_SEQ] == seq and p[P_CREATED]), default=0)
            else:
                i = rp.slot(seq)
                created = rp.c_created[i] if i >= 0 else 0
            if not created:
                return None
            age = s.dump_time_ns - created
            limit = rp.timeout_ms * 1_000_000 if rp.timeout_ms else IN_FLIGHT_NS
            if not 0 <= age < limit:
                return None
            if age >= oldest:
                oldest = age
                bound = f"its group's timeout of {ms(limit)}" if rp.timeout_ms else f"{ms(limit)} (no timeout known)"
    return oldest, bound


# a frame inside communication: torch.distributed (not its elastic agent's helpers) or frnccl
_COMM_FRAME = re.compile(r"torch[/\\]distributed[/\\](?!elastic[/\\])|fr_backend[/\\]")


def _pending_p2p(blocked_r: list[Blocked], r: int) -> list[tuple[PgView, tuple]]:
    """Rank r's p2p ops that did not complete, in the groups it is blocked in (as match.py pairs them)."""
    out = []
    for b in blocked_r:
        rp = b.pg.per_rank.get(r) if b.p2p else None
        if rp is not None:
            out += [(b.pg, p) for p in rp.p2ps
                    if p[P_STATE] != COMPLETED and (p[P_PEER] >= 0 or p[P_KIND] == "recv")]
    return out


def _went_on(r: int, blocked_r: list[Blocked]) -> tuple[Blocked, list[tuple[PgView, tuple]]] | None:
    """Rank r is inside a collective issued after every p2p op of its that did not complete (``record_id``
    order): it posted them asynchronously and went on. (That collective, those p2p ops), else None."""
    newest: tuple[int, Blocked] | None = None
    for b in blocked_r:
        rp = None if b.p2p else b.pg.per_rank.get(r)
        i = rp.slot(b.seq) if rp is not None else -1
        if i >= 0 and (newest is None or rp.c_record[i] > newest[0]):
            newest = (rp.c_record[i], b)
    pend = _pending_p2p(blocked_r, r)
    if newest is None or not pend or any(p[P_RECORD] >= newest[0] for _, p in pend):
        return None
    return newest[1], pend


def _async_p2p(res: LoadResult, cyc: list[int], blocked: dict[int, list[Blocked]], waits: list[Wait]
               ) -> tuple[dict[int, str], dict[int, str]]:
    """Which pending p2p ops of a cycle's ranks do not block them.

    ``went_on``: ranks inside a collective issued after their pending p2p ops (the record order shows it):
    those p2p ops were posted asynchronously and do not block them; they still wait in the collective.

    ``freed``: ranks whose only pending ops are p2p ops, none of whose threads is inside torch.distributed
    at dump time, and each of whose p2p waits is for a ``went_on`` rank of the same group: that group's
    program posts its p2p ops asynchronously, and these ranks went on too (a stage in compute after its
    isend): they are not blocked. Rank -> the evidence line. Without such a peer nothing is freed: a rank
    in ``work.wait()`` shows only its caller's frames, so a user-frame stack alone cannot tell a rank in
    compute from one blocked in its irecv while its peer skipped the send."""
    went: dict[int, tuple[Blocked, list[tuple[PgView, tuple]]]] = {}
    for r in cyc:
        x = _went_on(r, blocked.get(r, []))
        if x is not None:
            went[r] = x
    went_on = {r: _went_on_line(r, b, pend) for r, (b, pend) in went.items()}
    freed: dict[int, str] = {}
    mine: dict[int, list[Wait]] = {}
    for w in waits:
        for r in w.waiters:
            mine.setdefault(r, []).append(w)
    for r in cyc:
        bs = blocked.get(r, [])
        s = res.ranks.get(r)
        ws = mine.get(r, [])
        if (r in went or s is None or not bs or not all(b.p2p for b in bs) or not s.thread_stacks.strip()
                or _COMM_FRAME.search(s.thread_stacks) or not ws):
            continue
        if not all(w.p2p and w.targets and all(t in went and any(v is w.pg for v, _ in went[t][1])
                                               for t in w.targets) for w in ws):
            continue
        ops = "; ".join(f"{b.op} (pg {b.pg.label}, p2p seq {b.seq})" for b in bs[:3])
        peers = sorted({t for w in ws for t in w.targets})
        freed[r] = (f"rank {r}'s only pending ops are p2p ({ops}) and none of its threads is inside "
                    f"torch.distributed at dump time; {'; '.join(went_on[t] for t in peers[:3])}: this group's p2p "
                    f"ops are posted asynchronously (isend/irecv), and rank {r} went on too, so it is not blocked "
                    "by them")
    if set(cyc) <= set(freed):  # never every rank of a cycle (cannot happen: a freed rank waits on a went_on one)
        freed = {}
    return went_on, freed


def _went_on_line(r: int, b: Blocked, pend: list[tuple[PgView, tuple]]) -> str:
    ops = ", ".join(f"{p[P_NAME]} (pg {v.label}, p2p seq {p[P_SEQ]})" for v, p in pend[:3])
    return (f"rank {r} posted {ops} asynchronously: it went on to {b.op} (pg {b.pg.label}, seq {b.seq}), which it "
            f"issued after {'it' if len(pend) == 1 else 'them'} and is inside")


def _failed_waiters(w: Wait) -> list[int]:
    """Waiters of ``w`` whose op already failed (frnccl retired it without completing): not waiting any more."""
    out = []
    for r in w.waiters:
        rp = w.pg.per_rank.get(r)
        if rp is not None and w.seq in (rp.failed_p2p if w.p2p else rp.failed):
            out.append(r)
    return out


def _waiting(w: Wait, count: bool = False) -> str:
    """'3 ranks wait in it (0-2)', with the ranks whose op already failed said apart."""
    failed = _failed_waiters(w)
    live = [r for r in w.waiters if r not in failed]
    parts = []
    if live:
        parts.append(f"{len(live)} rank{'s wait' if len(live) != 1 else ' waits'} in it ({ranks_str(live)})"
                     if count else f"{rank_word(live)} wait{'s' if len(live) == 1 else ''} in it")
    if failed:
        parts.append(f"on {rank_word(failed)} it already failed")
    return "; ".join(parts)


def _wait_line(w: Wait, waiters: list[int], targets: str) -> str:
    """'ranks 0,1 wait in all_reduce (pg 0, seq 6) for rank 3', the ranks whose op failed said apart."""
    what = f"{w.op} (pg {w.pg.label}, {'p2p ' if w.p2p else ''}seq {w.seq})"
    failed = set(_failed_waiters(w))
    live = [r for r in waiters if r not in failed]
    dead = [r for r in waiters if r in failed]
    parts = []
    if live:
        parts.append(f"{rank_word(live)} wait{'s' if len(live) == 1 else ''} in {what} for {targets}")
    if dead:
        parts.append(f"{rank_word(dead)}: {what if not live else 'it'} failed, waiting for {targets}")
    return "; ".join(parts)


def _chain_lines(roots: list[int], in_edges: dict[int, list[Wait]], blocked: dict[int, list[Blocked]]) -> list[str]:
    """The waits that lead to ``roots``, level by level; one line per wait (its targets in this level
    together), blocked targets marked."""
    lines: list[str] = []
    seen = set(roots)
    frontier = list(roots)
    while frontier and len(lines) < 12:
        nxt: list[int] = []
        by_wait: dict[int, tuple[Wait, list[int]]] = {}
        for t in frontier:
            for w in in_edges.get(t, ()):
                by_wait.setdefault(id(w), (w, []))[1].append(t)
        for w, ts in sorted(by_wait.values(), key=lambda x: (x[0].pg.name, x[0].seq)):
            for part in (sorted(t for t in ts if t not in blocked), sorted(t for t in ts if t in blocked)):
                if part:
                    lines.append(_wait_line(w, w.waiters, rank_word(part))
                                 + ((" (itself blocked, see above)" if len(part) == 1 else " (themselves blocked, see above)")
                                    if part[0] in blocked else ""))
            for r in w.waiters:
                if r not in seen and r in in_edges:
                    seen.add(r)
                    nxt.append(r)
        frontier = nxt
    return lines


def _culprit_lines(res: LoadResult, cs: list[int], blocked: dict[int, list[Blocked]], outside: bool = True,
                   inside: set[int] | None = None) -> list[str]:
    """The culprits' last op, where it was called from, and their thread stacks; ``inside``: culprits in
    communication all the same (they skipped an op and went on, or posted p2p ops asynchronously)."""
    lines: list[str] = []
    for c in cs[:8]:
        s = res.ranks.get(c)
        if s is None:
            continue
        lo = s.last_op
        where = f" on {s.hostname} pid {s.pid}" if s.hostname else ""
        if lo is not None:
            lines.append(f"rank {c}{where}: last op {lo.name} (pg {lo.pg}, seq {lo.seq}, {STATE_NAMES[lo.state]})"
                         + (f" called from {lo.frame}" if lo.frame else ""))
        else:
            lines.append(f"rank {c}{where}: no ops recorded")
        if outside and c not in (inside or ()):
            lines.append(f"rank {c} is not inside any collective or p2p at dump time")
        if s.thread_stacks.strip():
            stack = s.thread_stacks.rstrip().splitlines()
            lines.append(f"rank {c} thread stacks at dump time:")
            lines += ["    " + ln for ln in stack[:STACK_LINES]]
            if len(stack) > STACK_LINES:
                lines.append(f"    ... {len(stack) - STACK_LINES} more lines")
        else:
            lines.append(f"rank {c}: no thread stacks in the dump")
    return lines


# --------------------------------------------------------------------------- mismatches


def _mismatch_findings(res: LoadResult, m: MatchResult) -> list[tuple[int, int, Finding]]:
    out: list[tuple[int, int, Finding]] = []
    first: dict[tuple[int, str, tuple[object, ...], bool], tuple[Mismatch, list[int]]] = {}
    for mm in m.mismatches:
        who = tuple(mm.culprits) if not mm.ambiguous else tuple(tuple(rs) for _, rs in mm.groups)
        key = (id(mm.pg), mm.kind, who, mm.p2p)
        if key in first:
            first[key][1].append(mm.seq)
        else:
            first[key] = (mm, [])
    for mm, later in first.values():
        if mm.kind == "op_mismatch":
            sides = "; ".join(f"{v}: {rank_word(rs)}" for v, rs in mm.groups)
        elif mm.kind == "size_mismatch":
            sides = "; ".join(f"{sizes_str(v) if not mm.p2p else v}: {rank_word(rs)}" for v, rs in mm.groups)
        else:
            sides = "; ".join(f"{v or '(none)'}: {rank_word(rs)}" for v, rs in mm.groups)
        what = {"op_mismatch": "different ops", "size_mismatch": "different sizes",
                "dtype_mismatch": "different dtypes"}[mm.kind]
        seqw = f"p2p seq {mm.seq}" if mm.p2p else f"seq {mm.seq}"
        if mm.ambiguous and mm.tie:
            involved = sorted(r for _, rs in mm.groups for r in rs)
            blame = (f"no majority among the ranks with a dump ({ranks_str(involved)}), and "
                     f"{rank_word(mm.deciders)} of this group left no dump and would decide which side is the odd "
                     "one: ambiguous, no rank is blamed")
        elif mm.ambiguous:
            lead = len(mm.groups[0][1]) - len(mm.groups[1][1])
            blame = (f"{rank_word(mm.groups[0][1])} outnumber{'s' if len(mm.groups[0][1]) == 1 else ''} the others "
                     f"by {lead} only, and {rank_word(mm.deciders)} of this group left no dump and could outvote "
                     "them: ambiguous, no rank is blamed")
        elif mm.tie:
            blame = f"no majority, so {rank_word(mm.culprits)} are all suspects"
        else:
            blame = f"{rank_word(mm.culprits)} disagree{'s' if len(mm.culprits) == 1 else ''} with the majority"
        detail = f"pg {mm.pg.label} {seqw} ({mm.op}): {what}, {blame}. {sides}"
        if later:
            detail += f". Same disagreement at {len(later)} later seq{'s' if len(later) != 1 else ''}"
        if mm.hanging:
            # A timeout's dumps: the ranks still wait in it. Others (an error, an abort, a rank that left): the
            # op broke the job at once, and nothing hangs.
            detail += (". The op has not completed: this is why the job hangs" if "timeout" in _dump_reasons(res)
                       else ". The op did not complete: this is where the job failed")
        f = Finding(mm.kind, mm.pg.name, mm.pg.desc, None if mm.p2p else mm.seq, mm.op, list(mm.culprits), detail)
        f.evidence, f.victims = _mismatch_evidence(res, mm)
        if mm.ambiguous:
            f.ranks = sorted({r for _, rs in mm.groups for r in rs} | set(mm.deciders))
            why = (f"{'its' if len(mm.deciders) == 1 else 'their'} {mm.kind[:-9]} at this seq would "
                   f"{'break the tie' if mm.tie else 'decide the majority'}")
            f.evidence = [f"{rank_word(mm.deciders)}: no dump (a crash, or a dump that failed); {why}"]
        if mm.p2p:
            f.p2p_seq_id = mm.seq
        out.append((TIER["hang_mismatch" if mm.hanging else "mismatch"], mm.t_created, f))
    return out


# --------------------------------------------------------------------------- information


def _info_findings(res: LoadResult, m: MatchResult, suspects: set[int]) -> list[tuple[int, int, Finding]]:
    out: list[tuple[int, int, Finding]] = []
    missing = [r for r in res.missing if r not in suspects and r not in res.elsewhere and r not in res.undecided]
    there = [r for r in res.missing if r not in suspects and r in res.elsewhere]
    if there:
        f = Finding("missing_dump", "", "", None, "", [],
                    f"{rank_word(there)}: no dump in this incident, but in sibling incidents (see the note)", "info")
        f.ranks = there
        out.append((TIER["info"], 0, f))
    if missing:
        bad = [p.path for p in res.problems]
        detail = f"no usable dump from {rank_word(missing)} (world size {res.world_size})"
        if bad:
            detail += f"; unreadable files: {', '.join(bad[:5])}" + (" ..." if len(bad) > 5 else "")
        f = Finding("missing_dump", "", "", None, "", [], detail, "info")
        f.ranks = missing
        out.append((TIER["info"], 0, f))
    if m.truncated:
        rs = sorted(m.truncated)
        f = Finding("truncated", "", "", None, "", [],
                    f"{rank_word(rs)} lost their oldest history to the ring buffer; only what every rank still holds "
                    "is compared", "info")
        f.ranks = rs
        out.append((TIER["info"], 1, f))
    return out
