"""Self-contained HTML report: findings first, then per PG a rank x seq grid coloured by
state, culprits highlighted, details on hover. No scripts or resources from the network."""

from __future__ import annotations

import html
from typing import Iterable

from .fmt import clean, rank_word
from .model import C_DTYPES, C_NAME, C_SIZES, C_STATE, COMPLETED, STATE_NAMES, PgView
from .report import Analysis

MAX_COLS = 48
MAX_ROWS = 64
MAX_PGS = 40

CSS = """
body{font:13px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px 24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 6px} .sub{color:#666}
.root{border:2px solid #c62828;background:#fff5f5;padding:10px 14px;border-radius:6px;margin:12px 0}
.root b.k{color:#c62828} .ok{border:2px solid #2e7d32;background:#f3fbf3;padding:10px 14px;border-radius:6px}
.f{margin:4px 0;padding:4px 8px;border-left:4px solid #999} .f.fault{border-color:#c62828} .f.suspect{border-color:#ef6c00}
.f.info{border-color:#90a4ae;color:#555} pre{background:#f6f6f6;padding:6px 8px;overflow:auto;max-height:260px;font-size:12px}
table.g{border-collapse:separate;border-spacing:1px;font-size:11px} table.g td{width:14px;height:14px;padding:0}
table.g th{font-weight:normal;color:#555;padding:0 4px;text-align:right;white-space:nowrap}
table.g thead th{text-align:center;font-size:9px;padding:0;writing-mode:vertical-rl;transform:rotate(180deg);height:34px}
td.c{background:#66bb6a} td.s{background:#ffb300} td.q{background:#64b5f6} td.n{background:#fff;outline:1px dashed #ccc}
td.x{background:repeating-linear-gradient(45deg,#ddd 0 3px,#fff 3px 6px)} td.m{background:#424242}
td.mm{box-shadow:inset 0 0 0 3px #8e24aa} td.nj{background:#fff;outline:2px solid #c62828}
tr.cul th{color:#c62828;font-weight:bold} tr.cul td{border-top:2px solid #c62828;border-bottom:2px solid #c62828}
.legend span{display:inline-block;margin-right:12px} .legend i{display:inline-block;width:12px;height:12px;vertical-align:-2px;margin-right:4px}
"""


def _esc(s: object) -> str:
    """Text for the page: HTML-escaped, other control characters shown as escapes; a newline stays one
    (a line break in a tooltip or a <pre>, harmless in a page)."""
    return html.escape("\n".join(map(clean, str(s).split("\n"))), quote=True)


def render(a: Analysis) -> str:
    res, m = a.res, a.match
    faults = [f for f in a.findings if f.is_fault]
    culprits = {r for f in faults for r in f.culprit_ranks}
    victims = {r for f in faults for r in f.victims}
    out: list[str] = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
                      "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'\">",
                      f"<title>frnccl report</title><style>{CSS}</style></head><body>",
                      "<h1>frnccl flight-recorder report</h1>",
                      f"<div class='sub'>{_esc(res.source)} &middot; world size {res.world_size} &middot; "
                      f"{len(res.ranks)} dumps &middot; missing: {_esc(rank_word(res.missing) if res.missing else 'none')}"
                      "</div>"]
    for x in a.aftershocks:  # later incidents that follow from this one: shown as its consequences, not causes
        out.append(f"<div class='f info'>{_esc(x.text())}</div>")
    if faults:
        f = faults[0]
        who = rank_word(f.culprit_ranks) if f.culprit_ranks else "no single rank"
        out.append(f"<div class='root'><b class='k'>Root cause: {_esc(who)}</b> &mdash; {_esc(f.kind)}<br>"
                   f"{_esc(f.detail)}")
        if f.evidence:
            out.append(f"<pre>{_esc(chr(10).join(f.evidence))}</pre>")
        out.append("</div>")
    else:
        out.append("<div class='ok'><b>No problems found.</b> Every rank's collectives and p2p ops match and "
                   "no rank waits on another.</div>")
    if len(a.findings) > (1 if faults else 0):
        out.append("<h2>All findings</h2>")
        for f in a.findings:
            who = rank_word(f.culprit_ranks) if f.culprit_ranks else ""
            out.append(f"<div class='f {f.severity}'><b>{_esc(f.kind)}</b> {_esc(who)}: {_esc(f.detail)}</div>")
    for p in res.problems:
        out.append(f"<div class='f info'>unreadable: {_esc(p.path)}: {_esc(p.reason)}</div>")
    out.append("<div class='legend' style='margin-top:14px'>"
               "<span><i style='background:#66bb6a'></i>completed</span><span><i style='background:#ffb300'></i>started</span>"
               "<span><i style='background:#64b5f6'></i>scheduled</span><span><i style='outline:1px dashed #ccc'></i>not issued</span>"
               "<span><i style='outline:2px solid #c62828'></i>never issued, others wait</span>"
               "<span><i style='box-shadow:inset 0 0 0 3px #8e24aa'></i>mismatch</span>"
               "<span><i style='background:repeating-linear-gradient(45deg,#ddd 0 3px,#fff 3px 6px)'></i>history cut</span>"
               "<span><i style='background:#424242'></i>no dump</span></div>")
    mm_at: dict[tuple[int, int], set[int]] = {}
    for mm in m.mismatches:
        if not mm.p2p:
            mm_at.setdefault((id(mm.pg), mm.seq), set()).update(mm.culprits)
    focus: dict[int, int] = {}
    for f in faults:
        for v in m.pgs:
            if v.name == f.pg and f.collective_seq_id is not None:
                focus.setdefault(id(v), f.collective_seq_id)
    pgs = sorted(m.pgs, key=lambda v: (id(v) not in focus, not (set(v.ranks) & culprits)))
    for v in pgs[:MAX_PGS]:
        out.append(_grid(v, focus.get(id(v)), culprits, victims, mm_at))
    if len(pgs) > MAX_PGS:
        out.append(f"<p class='sub'>{len(pgs) - MAX_PGS} more process groups not shown.</p>")
    out.append("</body></html>")
    return "\n".join(out)


def _rows(v: PgView, culprits: set[int], victims: set[int]) -> list[int]:
    ranks = list(v.ranks)
    first = [r for r in ranks if r in culprits] + [r for r in ranks if r in victims and r not in culprits]
    rest = [r for r in ranks if r not in culprits and r not in victims]
    rows = first + rest
    return sorted(rows[:MAX_ROWS])


def _grid(v: PgView, focus: int | None, culprits: set[int], victims: set[int],
          mm_at: dict[tuple[int, int], set[int]]) -> str:
    hi = max(v.max_seq, 1)
    if focus is not None and focus > hi:
        hi = focus
    lo = max(1, hi - MAX_COLS + 1)
    if focus is not None and focus < lo:
        lo = max(1, focus - MAX_COLS // 2)
        hi = lo + MAX_COLS - 1
    seqs = range(lo, hi + 1)
    rows = _rows(v, culprits, victims)
    waited = {s for s in seqs for rp in v.per_rank.values()
              if (c := rp.colls.get(s)) is not None and c[C_STATE] != COMPLETED}
    h = [f"<h2>pg {_esc(v.label)} &middot; {_esc(rank_word(v.ranks))} &middot; seq {lo}&ndash;{hi}</h2>",
         "<table class='g'><thead><tr><th></th>" + "".join(f"<th>{s}</th>" for s in seqs) + "</tr></thead><tbody>"]
    for r in rows:
        rp = v.per_rank.get(r)
        cls = " class='cul'" if r in culprits else ""
        waiting = rp is not None and any(c[C_STATE] != COMPLETED for s2 in seqs if (c := rp.colls.get(s2)) is not None)
        tag = " (culprit)" if r in culprits else (" (waiting)" if waiting else "")
        cells: list[str] = []
        for s in seqs:
            cells.append(_cell(v, r, s, rp, waited, mm_at))
        h.append(f"<tr{cls}><th>rank {r}{_esc(tag)}</th>{''.join(cells)}</tr>")
    if len(v.ranks) > len(rows):
        h.append(f"<tr><th colspan='{len(seqs) + 1}' style='text-align:left'>"
                 f"{len(v.ranks) - len(rows)} more ranks not shown</th></tr>")
    h.append("</tbody></table>")
    return "\n".join(h)


def _cell(v: PgView, r: int, s: int, rp: object, waited: Iterable[int], mm_at: dict[tuple[int, int], set[int]]) -> str:
    tip = f"rank {r} | pg {v.label} | seq {s}"
    if rp is None:
        return f"<td class='m' title='{_esc(tip + chr(10) + 'no dump from this rank')}'></td>"
    from .model import RankPg

    assert isinstance(rp, RankPg)
    c = rp.colls.get(s)
    if c is None:
        if s <= rp.dropped_coll:
            return f"<td class='x' title='{_esc(tip + chr(10) + 'history cut by the ring buffer')}'></td>"
        if s > rp.last_enqueued_coll and s in waited:
            return f"<td class='nj' title='{_esc(tip + chr(10) + 'never issued; other ranks wait in it')}'></td>"
        return f"<td class='n' title='{_esc(tip + chr(10) + 'not issued')}'></td>"
    st = c[C_STATE]
    cls = "c" if st == COMPLETED else ("s" if st == 1 else "q")
    mm = mm_at.get((id(v), s))
    if mm is not None and r in mm:
        cls += " mm"
    text = f"{tip}\n{c[C_NAME]}\nstate: {STATE_NAMES[st]}\nsizes: {c[C_SIZES] or '-'}\ndtypes: {c[C_DTYPES] or '-'}"
    if mm is not None:
        text += "\nMISMATCH at this seq" + (" (this rank disagrees)" if r in mm else "")
    return f"<td class='{cls}' title='{_esc(text)}'></td>"


def write_html(a: Analysis, path: str) -> None:
    # backslashreplace: a lone surrogate from a JSON dump (or an undecodable file name) shows as \udcxx
    with open(path, "w", encoding="utf-8", errors="backslashreplace") as f:
        f.write(render(a))
