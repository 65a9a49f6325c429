"""Early exit: the one rank that left the loop for a closing collective while every other rank went on.

A rank that runs out of data leaves the training loop and enters the job's closing op (a world barrier, a final
world all_reduce); its peers go on to the next step and wait for it there, and the ranks behind them wait for
those peers. Every rank waits on someone, so the waits form a cycle, but the cycle has one odd rank:

  * the leaver ``L`` is the only rank inside its op (group ``G``, seq ``n``), and every other member of ``G``, at
    least two of them, never issued it: they all stand where ``L`` stood before it left (seq ``n - 1`` of ``G``);
  * every other rank waits in one collective, and its waits lead to ``L`` alone, directly (it waits for ``L`` in
    an op ``L`` never issued) or through other ranks, once ``L``'s own wait is set aside: no other cycle, no
    other rank waited on, nothing missing;
  * no other rank fits this shape.

Then ``L`` went elsewhere and the others are where the program put them: it is named. The same rule, on the
store summaries, gives the log's verdict (backend/VerdictEarlyExit.cpp); both must agree.

Refused (nothing named): two or more ranks inside the closing op (they left together: a tie of sides the dumps
cannot break), a group of two (one rank against one), two candidates (ranks that issued two groups' ops in
opposite orders on purpose), p2p waits, a rank inside two ops, or members without a dump.
"""

from __future__ import annotations

from dataclasses import dataclass

from .fmt import rank_word
from .match import Blocked, Wait

MIN_OTHERS = 2  # other members of the leaver's group that never issued its op: one would be one against one
SAID_WAITS = 4  # peers' waits said in the detail


@dataclass
class EarlyExit:
    rank: int
    own: Wait  # the op it is in, that no other member of its group reached
    peer_waits: list[Wait]  # ops it never issued that others wait for it in, the named one first
    indirect: list[int]  # ranks that wait on its peers through other groups
    behind: list[Wait]  # the ops those ranks wait in

    @property
    def named(self) -> Wait:
        return self.peer_waits[0]

    @property
    def victims(self) -> list[int]:
        return sorted({r for w in self.peer_waits for r in w.waiters} | set(self.indirect))

    def detail(self) -> str:
        o = self.own
        peers = ", ".join(f"{rank_word(w.waiters)} in {w.op} (pg {w.pg.label}, seq {w.seq})"
                          for w in self.peer_waits[:SAID_WAITS])
        if len(self.peer_waits) > SAID_WAITS:
            peers += f" and {len(self.peer_waits) - SAID_WAITS} more ops"
        text = (f"rank {self.rank} left the loop early: it is in {o.op} (pg {o.pg.label}, seq {o.seq}), which no "
                f"other member reached, while its peers wait for it in ops it never issued: {peers}")
        if self.indirect:
            text += (f"; {rank_word(self.indirect)} wait{'s' if len(self.indirect) == 1 else ''} on them through "
                     "other groups")
        return text


def _name_key(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)


def early_exit(world_size: int, present: set[int], waits: list[Wait], blocked: dict[int, list[Blocked]],
               undecidable: bool) -> EarlyExit | None:
    """The single rank that left the loop early, with the evidence; None where the waits do not show exactly one.
    ``undecidable``: other evidence rules it out (a hanging mismatch, an op every member is stuck in)."""
    if undecidable or set(range(world_size)) - present or not waits:
        return None
    if any(len(blocked.get(r, ())) != 1 for r in range(world_size)):
        return None  # a rank inside two ops (or none): more than one point of the program
    mine: dict[int, Wait] = {}
    if len({id(w.pg) for w in waits}) != len(waits):
        return None  # a group waited in at two seqs: the summaries (one op a group) cannot tell it, nor is it one step
    for w in waits:
        if w.p2p or w.missing_targets or not w.targets:
            return None
        for r in w.waiters:
            if r in mine:
                return None  # inside two ops: more than one point of the program
            mine[r] = w
    if set(mine) != set(range(world_size)):
        return None  # a rank outside communication: not_joined's, not this rule's
    found = [x for r, w in sorted(mine.items()) if (x := _as_leaver(r, w, mine)) is not None]
    return found[0] if len(found) == 1 else None


def _as_leaver(r: int, w: Wait, mine: dict[int, Wait]) -> EarlyExit | None:
    others = [m for m in w.pg.ranks if m != r]
    if w.waiters != [r] or len(others) < MIN_OTHERS or sorted(w.targets) != sorted(others):
        return None
    explained = {r}
    grew = True
    while grew:  # a rank is explained once everyone it waits for is: chains that end at r
        grew = False
        for u, wu in mine.items():
            if u not in explained and wu is not w and set(wu.targets) <= explained:
                explained.add(u)
                grew = True
    if explained != set(mine):
        return None
    direct = {id(x): x for u, x in mine.items() if u != r and r in x.targets}
    peer_waits = sorted(direct.values(), key=lambda x: (-len(_held(x, mine, r)), x.seq, _name_key(x.pg.name)))
    said = {u for x in peer_waits for u in x.waiters}
    indirect = sorted(set(mine) - said - {r})
    behind = list({id(mine[u]): mine[u] for u in indirect}.values())
    return EarlyExit(r, w, peer_waits, indirect, behind)


def _held(w: Wait, mine: dict[int, Wait], leaver: int) -> set[int]:
    """The ranks held up in ``w``: its waiters and those that wait on them, directly or through others."""
    held = set(w.waiters)
    grew = True
    while grew:
        grew = False
        for u, wu in mine.items():
            if u != leaver and u not in held and held & set(wu.targets):
                held.add(u)
                grew = True
    return held

