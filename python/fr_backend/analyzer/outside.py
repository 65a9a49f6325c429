"""A failure outside collectives: a quorum's timeout (torchft), a lighthouse that cannot be reached, a data loader's
error. A rank left the job with an uncaught exception while no rank was inside a collective or p2p op: nobody
waits for anybody, so the dumps name no rank, but they do say what was raised, where, and where every other rank
was. Without this the report said "No problems found" on the incident of a job that failed.

The rule is the log's (backend/Verdict.cpp, outsideCollectives) on the dumps instead of the store summaries, with
the same text: the raisers in the order they raised (a few), then where the others were, the innermost frame
outside torch's wrappers of the thread that issued their last op (RankSummary.cpp, userFrameOfThread). Refused
(left to the other rules): any rank inside an op, or another fault found.
"""

from __future__ import annotations

import re

from .aftermath import open_ops
from .match import Wait
from .model import Finding, LoadResult, RankSummary

MAX_SAID = 4  # raisers, and ranks' places, said in the detail (the log's kMaxSaid)
EXIT_SAID = 300  # bytes of a raiser's exception said (the log's bound)
FRAME_SAID = 160  # bytes of a rank's place said
TRACEBACK_LINES = 12

_THREAD = re.compile(r"hread 0x([0-9a-fA-F]+) .*\(most recent call first\)")
_FRAME = re.compile(r'\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<fn>.*)')
_TORCH_WRAPPER = re.compile(r"(^|[/\\])torch[/\\](distributed|nn[/\\]parallel)[/\\]")


def printable(text: str, limit: int) -> str:
    """The log's printable(): every byte outside printable ASCII (and the backslash) as \\xNN, cut to ``limit``."""
    out: list[str] = []
    size = 0
    for b in text.encode("utf-8", "backslashreplace"):
        if size >= limit:
            out.append("...")
            break
        piece = chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}"
        out.append(piece)
        size += len(piece)
    return "".join(out)


def user_frame(stacks: str, thread_id: int) -> str:
    """'FILE:LINE in FUNCTION' of the innermost frame outside torch's wrappers of thread ``thread_id`` (0: the
    first thread listed) in faulthandler's text; the innermost frame if all are torch's; "" if none."""
    in_thread = seen = False
    first = ""
    for raw in stacks.splitlines():
        line = raw[:4096]
        if (t := _THREAD.search(line)) is not None:
            if in_thread:
                break  # the thread's frames ended without one outside torch
            in_thread = not seen if thread_id == 0 else int(t.group(1), 16) == thread_id
            seen = True
            continue
        if not in_thread or (m := _FRAME.fullmatch(line)) is None:
            continue
        text = f"{m['file']}:{m['line']} in {m['fn']}"
        first = first or text
        if not _TORCH_WRAPPER.search(m["file"]):
            return text
    return first


def _where(s: RankSummary) -> str:
    return user_frame(s.thread_stacks, s.last_op.thread_id) if s.last_op is not None else ""


def also_not_in(res: LoadResult, w: Wait) -> str:
    """The other members that never issued the op a raiser was waited for in (the oldest such wait, as the log
    takes it) and that are outside collectives too, with no exception of their own: where each was, a few. Not
    named: the dumps cannot tell whether they would have come (the log's alsoNotIn)."""
    places = []
    for r in w.targets:
        s = res.ranks.get(r)
        if s is None or s.exit is not None or any(open_ops(rp) for rp in s.pgs.values()) or not (where := _where(s)):
            continue
        places.append(f"rank {r} at {printable(where, FRAME_SAID)}")
    if not places:
        return ""
    more = f" and {len(places) - MAX_SAID} more" if len(places) > MAX_SAID else ""
    return "; also not in it, outside collectives: " + ", ".join(places[:MAX_SAID]) + more


def outside_findings(res: LoadResult, found: list[Finding]) -> list[Finding]:
    """One fault naming no rank, where some rank left with an exception and nobody was inside an op."""
    if any(f.is_fault for f in found) or any(open_ops(rp) for s in res.ranks.values() for rp in s.pgs.values()):
        return []
    raisers = sorted((r for r, s in res.ranks.items() if s.exit is not None),
                     key=lambda r: (res.ranks[r].exit.time_ns, r))  # type: ignore[union-attr]
    if not raisers:
        return []
    said = []
    evidence: list[str] = []
    for r in raisers[:MAX_SAID]:
        s = res.ranks[r]
        assert s.exit is not None
        who = f"rank {r} (host {s.hostname or '?'}, pid {s.pid if s.pid is not None else '?'})"
        said.append(f"{who} raised outside collectives: {printable(s.exit.one_line(), EXIT_SAID)}")
        evidence += [f"rank {r} traceback, innermost last:"] + [
            "  " + ln for ln in s.exit.traceback.splitlines()[-TRACEBACK_LINES:]]
    detail = "; then ".join(said)
    if len(raisers) > MAX_SAID:
        detail += f"; and {len(raisers) - MAX_SAID} more"
    detail += "; no rank is inside a collective or p2p op in its summary, so none is named"
    places = [(r, w) for r, s in sorted(res.ranks.items()) if s.exit is None and (w := _where(s))]
    if places:
        detail += "; " + ", ".join(f"rank {r} at {printable(w, FRAME_SAID)}" for r, w in places[:MAX_SAID])
        if len(places) > MAX_SAID:
            detail += f" and {len(places) - MAX_SAID} more"
    return [Finding("outside_collectives", "", "", None, "", [], detail, "fault", evidence, [], ranks=raisers)]
