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

DECIDED_RE = re.compile(
    r"frnccl: verdict: (?P<kind>\w+): ranks? (?P<ranks>[0-9,]+) \(.*?\); op (?P<op>\S+) (?P<p2p>p2p )?seq (?P<seq>\d+), "
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


def verdicts(log: str) -> list[LogVerdict]:
    """Every verdict the log holds, in order."""
    out = []
    for line in log.splitlines():
        if m := DECIDED_RE.search(line):
            out.append(LogVerdict(True, m["kind"], tuple(int(r) for r in m["ranks"].split(",")), m["op"],
                                  bool(m["p2p"]), int(m["seq"]), m["pg"], m["desc"]))
        elif m := UNDECIDED_RE.search(line):
            out.append(LogVerdict(False, why=m["why"]))
    return out


def _op(name: str) -> str:
    """The op's name without the backend prefix and the p2p direction: gloo:send 0->1 -> send."""
    return name.split(":", 1)[-1].split(" ", 1)[0]


def disagreement(verdict: LogVerdict, report: dict[str, Any]) -> str | None:
    """None when a decided verdict says what the analyzer's first finding says (kind, culprits, op, group, seq);
    else what differs. An undecided verdict agrees with anything: it names no rank."""
    if not verdict.decided:
        return None
    findings = report.get("findings") or []
    if not findings:
        return f"the analyzer has no finding, the log says {verdict}"
    f = findings[0]
    want = (f["kind"], tuple(f["culprit_ranks"]), _op(str(f["op"])), str(f["pg"]),
            f["p2p_seq_id"] if verdict.p2p else f["collective_seq_id"])
    got = (verdict.kind, verdict.culprits, verdict.op, verdict.pg, verdict.seq)
    return None if want == got else f"log verdict {got} != analyzer's first finding {want}"


def check_agreement(log: str, report: dict[str, Any], undecided_ok: bool = True) -> LogVerdict | None:
    """Asserts that every verdict in the log agrees with the analyzer; returns the last one (None if none)."""
    found = verdicts(log)
    print(f"log verdicts: {found or 'none'}")  # shown with -s: what each scenario's log said
    for v in found:
        why = disagreement(v, report)
        assert why is None, f"{why}\n{log}"
        assert undecided_ok or v.decided, f"the verdict could not decide: {v.why}\n{log}"
    return found[-1] if found else None
