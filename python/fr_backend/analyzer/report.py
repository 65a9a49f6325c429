"""Run the pipeline (load -> match -> findings) and render it for people or as JSON."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from .aftermath import Aftershock, follows
from .findings import IN_FLIGHT, analyze
from .stragglers import Options
from .fmt import clean, rank_word
from .load import InputError, load
from .match import MatchResult, match
from .model import Finding, LoadResult
from .trust import settle_ties


@dataclass
class Analysis:
    res: LoadResult
    match: MatchResult
    findings: list[Finding]
    aftershocks: list[Aftershock] = field(default_factory=list)  # later incidents that follow from this one


MAX_EARLIER = 4  # older incidents looked at for the one a later incident follows from (each is a load)


def run(paths: list[str], incident: str | None = None, progress: Callable[[int, int], None] | None = None,
        pg: str | None = None, opts: Options | None = None, jobs: int | None = None,
        isolate: bool = False, job: str | None = None) -> Analysis:
    res = load(paths, incident, progress, jobs=jobs, isolate=isolate, job=job)
    res, shocks = _first_of_its_aftershocks(res, paths, progress, jobs, isolate)
    was_enabled = gc.isenabled()
    gc.disable()  # matching makes millions of small tuples and lists: the cyclic GC would rescan the summaries
    try:
        m = match(res)
        settle_ties(res, m)
        fs = analyze(res, m, opts)
    finally:
        if was_enabled:
            gc.enable()
    if pg is not None:
        fs = [f for f in fs if not f.pg or pg in (f.pg, f.pg_desc)]
    return Analysis(res, m, fs, shocks)


def _first_of_its_aftershocks(res: LoadResult, paths: list[str], progress: Callable[[int, int], None] | None,
                              jobs: int | None, isolate: bool) -> tuple[LoadResult, list[Aftershock]]:
    """The latest incident of a dump directory, or the earlier one it follows from (aftermath.py), and so on back
    to the first: that one leads, the later ones are its aftershocks."""
    shocks: list[Aftershock] = []
    while res.earlier:
        for path in res.earlier[:MAX_EARLIER]:
            try:
                older = load(paths, None, progress, jobs=jobs, isolate=isolate, latest=os.path.basename(path),
                             job=res.job_tag or None)
            except InputError:
                continue
            why = follows(res, older)
            if why is not None:
                reason = next((s.dump_reason for s in res.ranks.values() if s.dump_reason), "?")
                shocks.insert(0, Aftershock(res.source, reason, sorted(res.ranks), why))
                older.notes[:0] = [a.text() for a in shocks]
                res = older
                break
        else:
            break
    return res, shocks


def exit_code(findings: list[Finding]) -> int:
    """0: no fault (performance findings and notes only), 1: at least one fault or suspect. (2, unusable
    input, is the CLI's.)"""
    return 1 if any(f.is_fault for f in findings) else 0


def to_json(a: Analysis) -> dict[str, Any]:
    res = a.res
    return {
        "world_size": res.world_size,
        "ranks_found": sorted(res.ranks),
        "ranks_missing": res.missing,
        "ranks_in_sibling_incidents": {str(r): p for r, p in sorted(res.elsewhere.items())},
        "findings": [f.to_json() for f in a.findings],
        "source": res.source,
        "job_tag": res.job_tag,  # the one job whose dumps were read ("" where they do not say)
        "incidents_read": sorted({s.incident_id for s in res.ranks.values() if s.incident_id}),
        "unreadable_files": [{"path": p.path, "reason": p.reason} for p in res.problems],
        "notes": list(res.notes),
        # several usable files claimed one rank: each is listed, with the one used (null: none, the rank undecided)
        "rank_conflicts": [c.to_json() for c in res.conflicts],
        "ranks_undecided": sorted(res.undecided),
        "clock": a.match.clocks.to_json(),
        # later incidents of the dump directory that follow from this one (its abort or exit): not root causes
        "aftershocks": [x.to_json() for x in a.aftershocks],
    }


def clocks_matter(a: Analysis) -> bool:
    """Whether a host's clock offset entered a verdict: only straggler findings compare arrival times across
    ranks (match.py corrects them by each clock's offset), and only when a rank of their group was corrected.
    Elsewhere (one host, as the demo's: its ranks' "offsets" are when each watchdog saw a completion) the
    offsets change nothing, and are in --json and -v only."""
    corrected = a.match.clocks.offset
    if not corrected:
        return False
    groups = {v.name: v.ranks for v in a.match.pgs}
    return any(f.kind == "straggler" and any(corrected.get(r) for r in groups.get(f.pg, f.culprit_ranks))
               for f in a.findings)


def to_text(a: Analysis, max_evidence: int = 80, clocks: bool = False) -> str:
    """The report for people; the host clocks section with ``clocks`` (-v), or where the offsets entered a
    verdict (clocks_matter)."""
    res = a.res
    lines: list[str] = []
    any_s = next(iter(res.ranks.values()))
    fmts = sorted({f"{s.fmt} {s.version}" for s in res.ranks.values()})
    head = f"frnccl analyze {res.source}: world size {res.world_size}, dumps from {len(res.ranks)} rank" \
           f"{'s' if len(res.ranks) != 1 else ''} ({', '.join(fmts)})"
    lines.append(head)
    if any_s.incident_id or any_s.dump_reason:
        lines.append(f"incident {any_s.incident_id or '?'}: {any_s.dump_reason or '?'}"
                     + (f" - {any_s.dump_detail}" if any_s.dump_detail else ""))
    gone = [r for r in res.missing if r not in res.elsewhere and r not in res.undecided]
    if gone:
        lines.append(f"missing: {rank_word(gone)}")
    if res.undecided:
        lines.append(f"undecided: {rank_word(sorted(res.undecided))} (several files claim it, see the note)")
    if res.elsewhere:
        lines.append(f"not in this incident, dumps in sibling incidents: {rank_word(res.elsewhere)}")
    for p in res.problems:
        lines.append(f"unreadable: {p.path}: {p.reason}")
    for n in res.notes:
        lines.append(f"note: {n}")
    faults = [f for f in a.findings if f.is_fault]
    perf = [f for f in a.findings if f.severity == "performance"]
    infos = [f for f in a.findings if f.severity == "info"]
    lines.append("")
    if not faults and any(f.detail.startswith(IN_FLIGHT) for f in infos):
        lines.append("No problems found: the collectives and p2p ops of every rank match; what ranks wait in at "
                     "dump time is within its timeout (see the notes).")
    elif not faults:
        lines.append("No problems found: the collectives and p2p ops of every rank match, and no rank is "
                     "waiting on another.")
    for i, f in enumerate(faults):
        if i == 0:
            who = rank_word(f.culprit_ranks) if f.culprit_ranks else "no single rank"
            lines.append(f"ROOT CAUSE: {who} - {f.kind}")
        else:
            if i == 1:
                lines.append("")
                lines.append("Other findings:")
            who = rank_word(f.culprit_ranks) if f.culprit_ranks else "-"
            lines.append(f"{i + 1}. {f.kind}: {who}")
        lines.append(f"   {f.detail}")
        if f.victims and i == 0:
            lines.append(f"   victims (only waiting): {rank_word(f.victims)}")
        ev = f.evidence if i == 0 else f.evidence[:8]
        for e in ev[:max_evidence]:
            lines.append(f"   | {e}")
        if len(ev) > max_evidence:
            lines.append(f"   | ... {len(ev) - max_evidence} more lines (see --json)")
    if perf:
        lines.append("")
        lines.append("Performance (not a fault):")
        for f in perf:
            lines.append(f"- {f.kind}: {rank_word(f.culprit_ranks)} - {f.detail}")
    skew = [h for h in a.match.clocks.hosts if h.rank_offsets_ns or (
        h.offset_ns and h.uncertainty_ns is not None and abs(h.offset_ns) > 3 * h.uncertainty_ns)]
    if not (clocks or clocks_matter(a)):
        skew = []
    if skew:
        lines.append("")
        lines.append(f"Host clocks (offset against {a.match.clocks.reference}, estimated from collective ends; "
                     "arrival times are corrected by it):")
        for h in sorted(skew, key=lambda h: -abs(h.offset_ns))[:8]:
            u = f" +- {h.uncertainty_ns / 1e6:.3f} ms" if h.uncertainty_ns is not None else ""
            if h.rank_offsets_ns:
                lo, hi = min(h.rank_offsets_ns.values()), max(h.rank_offsets_ns.values())
                # Not "separate clocks": on CPU groups a rank whose watchdog sees completions later reads the same.
                lines.append(f"- {h.host}: its ranks' offsets differ: {lo / 1e6:+.3f} to {hi / 1e6:+.3f} ms{u} "
                             "(each rank corrected by its own, see --json; a rank that sees completions later, as "
                             "on CPU groups, reads as an offset too)")
            else:
                lines.append(f"- {h.host}: {h.offset_ns / 1e6:+.3f} ms{u}")
        if len(skew) > 8:
            lines.append(f"- ... {len(skew) - 8} more hosts (see --json)")
    if infos:
        lines.append("")
        lines.append("Notes:")
        for f in infos:
            lines.append(f"- {f.kind}: {f.detail}")
    # every line may carry dump-supplied text (names, reasons, paths): no control character reaches the terminal
    return "\n".join(map(clean, lines)) + "\n"
