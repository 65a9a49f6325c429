"""The verdict a job-wide dump's trigger prints (`frnccl: verdict: ...`), read back from a job's log, and its
agreement with `frnccl analyze --json` on the whole dumps.

The first verdict line reads
    frnccl: verdict: KIND: rank R (host H, pid P); op OP seq S, group NAME (DESC); ...
or, for a p2p op, `op OP p2p seq S`; where the summaries cannot decide,
    frnccl: verdict: undecided: WHY...
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# More than 12 culprits are listed as the first 12 and ",... (N in all)".
DECIDED_RE = re.compile(
    r"frnccl: verdict: (?P<kind>\w+): ranks? (?P<ranks>[0-9]+(?:,[0-9]+)*)(?:,\.\.\. \((?P<all>\d+) in all\))? \(.*?\); op (?P<op>\S+) (?P<p2p>p2p )?seq (?P<seq>\d+), "
    r"group (?P<pg>\S+) \((?P<desc>[^)]*)\)")
# Other ops the culprits never issued, created within the clocks' uncertainty of the named one.
ALSO_RE = re.compile(r"(?:also never|nor) (?:issued|posted the partner of) op (?P<op>\S+) (?P<p2p>p2p )?seq (?P<seq>\d+), "
                     r"group (?P<pg>\S+) \((?P<desc>[^)]*)\)")
UNDECIDED_RE = re.compile(r"frnccl: verdict: undecided: (?P<why>.*)")
TAIL_RE = re.compile(r"frnccl: (\d+)/(\d+) ranks wrote incident (\S+) in [0-9.]+ s; full analysis: frnccl analyze (\S+)")


@dataclass(frozen=True)
class LogVerdict:
    decided: bool
    kind: str = ""
    culprits: tuple[int, ...] = ()
    op: str = ""
    p2p: bool = False
    seq: int = 0
    pg: str = ""
    desc: str = ""
    why: str = ""
    also: tuple[tuple[str, bool, int, str], ...] = ()  # (op, p2p, seq, pg) said with the named op
    culprit_count: int = 0  # how many culprits in all (more than `culprits` lists when the line cut the list)


def verdicts(log: str) -> list[LogVerdict]:
    """Every verdict the log holds, in order. A line that begins as a verdict but reads as neither form fails:
    a format the reader does not follow must not pass as "no verdict"."""
    out = []
    for line in log.splitlines():
        if m := DECIDED_RE.search(line):
            also = tuple((a["op"], bool(a["p2p"]), int(a["seq"]), a["pg"]) for a in ALSO_RE.finditer(line))
            ranks = tuple(int(r) for r in m["ranks"].split(","))
            out.append(LogVerdict(True, m["kind"], ranks, m["op"], bool(m["p2p"]), int(m["seq"]), m["pg"], m["desc"],
                                  also=also, culprit_count=int(m["all"]) if m["all"] else len(ranks)))
        elif m := UNDECIDED_RE.search(line):
            out.append(LogVerdict(False, why=m["why"]))
        elif line.lstrip().startswith("frnccl: verdict:"):
            raise AssertionError(f"a verdict line in no known form: {line!r}")
    return out


def _op(name: str) -> str:
    """The op's name without the backend prefix and the p2p direction: gloo:send 0->1 -> send."""
    return name.split(":", 1)[-1].split(" ", 1)[0]


def disagreement(verdict: LogVerdict, report: dict[str, Any]) -> str | None:
    """None when a decided verdict says what the analyzer's first finding says (kind, culprits, op, group, seq);
    else what differs. An undecided verdict agrees with anything: it names no rank; but one that says a rank
    raised outside collectives must be the analyzer's first finding, word for word (outside_collectives, no
    rank named). Where the culprits skipped several ops created within the clocks' uncertainty, the verdict
    names one and says the others ("also never issued ..."): the analyzer's, ordered on its corrected clocks,
    must be among them."""
    if not verdict.decided:
        if " raised outside collectives: " not in verdict.why:
            return None
        first = (report.get("findings") or [{}])[0]
        got = (first.get("kind"), first.get("culprit_ranks"), first.get("detail"))
        return None if got == ("outside_collectives", [], verdict.why) else f"log: {verdict.why!r}; analyzer: {got}"
    findings = report.get("findings") or []
    if not findings:
        return f"the analyzer has no finding, the log says {verdict}"
    f = findings[0]
    culprits = tuple(f["culprit_ranks"])
    if verdict.culprit_count != len(verdict.culprits):  # the line listed the first ones and the count
        culprits = culprits[:len(verdict.culprits)] if len(culprits) == verdict.culprit_count else culprits

    def want(p2p: bool) -> tuple[Any, ...]:
        return (f["kind"], culprits, _op(str(f["op"])), str(f["pg"]), f["p2p_seq_id"] if p2p else f["collective_seq_id"])

    said = [((verdict.kind,), verdict.culprits, verdict.op, verdict.pg, verdict.seq, verdict.p2p)]
    # "also never posted the partner of op send p2p seq S": the claim of the analyzer's p2p_unmatched finding
    # (that rank, that op, group and p2p seq), which it names first where it ordered that op first.
    said += [((verdict.kind, "p2p_unmatched") if p2p else (verdict.kind,), verdict.culprits, op, pg, seq, p2p)
             for op, p2p, seq, pg in verdict.also]
    for kinds, who, op, pg, seq, p2p in said:
        w = want(p2p)
        if w[0] in kinds and (who, op, pg, seq) == w[1:]:
            return None
    return f"log verdict {[(k[0], *rest[:4]) for k, *rest in said]} != analyzer's first finding {want(verdict.p2p)}"


def check_agreement(log: str, report: dict[str, Any], *, undecided_ok: bool = False,
                    verdict_optional: bool = False) -> LogVerdict | None:
    """Asserts that the log holds a verdict and that every verdict in it agrees with the analyzer, decided: where
    the analyzer decides, so must the log. `undecided_ok`: a scenario documented as one the summaries cannot
    decide (an undecided verdict then agrees with anything: it names no rank). `verdict_optional`: one whose
    trigger may end before it prints one (the launcher stops it). Returns the last verdict (None if none)."""
    found = verdicts(log)
    print(f"log verdicts: {found or 'none'}")  # shown with -s: what each scenario's log said
    assert found or verdict_optional, f"no verdict in the log\n{log}"
    for v in found:
        why = disagreement(v, report)
        assert why is None, f"{why}\n{log}"
        assert undecided_ok or v.decided, f"the verdict could not decide: {v.why}\n{log}"
    return found[-1] if found else None
