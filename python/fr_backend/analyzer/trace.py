"""One Chrome/Perfetto trace of all ranks: a process per rank, a track per PG, flow
arrows between the matched ops of each collective (and each send/recv pair), and
the culprits marked (process name, sort order, colour and an instant event)."""

from __future__ import annotations

import json
from typing import Any

from .model import (
    C_COMPLETED,
    C_CREATED,
    C_NAME,
    C_SEQ,
    C_SIZES,
    C_STARTED,
    C_STATE,
    COMPLETED,
    P_COMPLETED,
    P_CREATED,
    P_KIND,
    P_NAME,
    P_PEER,
    P_SEQ,
    P_STATE,
    STATE_NAMES,
    PgView,
)
from .report import Analysis


def _culprits(a: Analysis) -> dict[int, str]:
    out: dict[int, str] = {}
    for f in a.findings:
        if not f.is_fault:
            continue
        for r in f.culprit_ranks:
            where = f"pg {f.pg}" + (f" seq {f.collective_seq_id}" if f.collective_seq_id is not None else "")
            out.setdefault(r, f"{f.kind} ({where})")
    return out


def build_trace(a: Analysis) -> dict[str, Any]:
    res, m = a.res, a.match
    culprits = _culprits(a)
    t_min = min((c[C_CREATED] - m.clocks.offset.get(r, 0) for v in m.pgs for r, rp in v.per_rank.items()
                 for c in rp.colls.values() if c[C_CREATED]), default=0)
    dump_end = {r: s.dump_time_ns for r, s in res.ranks.items()}

    offs = m.clocks.offset  # each rank's time on the reference host's clock, like the analysis

    def us(t: int, r: int) -> float:
        return (t - offs.get(r, 0) - t_min) / 1000.0

    ev: list[dict[str, Any]] = []
    for r, s in res.ranks.items():
        label = f"rank {r}" + (f" ({s.hostname})" if s.hostname else "")
        if r in culprits:
            label += f"  CULPRIT: {culprits[r]}"
        ev.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": label}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": -1 if r in culprits else r}})
    tids = {id(v): i + 1 for i, v in enumerate(m.pgs)}
    flow_id = 0
    for v in m.pgs:
        tid = tids[id(v)]
        for r in v.per_rank:
            ev.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": f"pg {v.label}"}})
        seqs: dict[int, list[tuple[int, float]]] = {}
        for r, rp in v.per_rank.items():
            end_default = dump_end.get(r) or 0
            for c in rp.colls.values():
                if not c[C_CREATED]:
                    continue
                start = c[C_STARTED] or c[C_CREATED]
                end = c[C_COMPLETED] if c[C_STATE] == COMPLETED and c[C_COMPLETED] else max(end_default, start + 1000)
                e = {"ph": "X", "pid": r, "tid": tid, "name": c[C_NAME], "ts": us(start, r),
                     "dur": max((end - start) / 1000.0, 0.001), "cat": "collective",
                     "args": {"seq": c[C_SEQ], "state": STATE_NAMES[c[C_STATE]], "sizes": c[C_SIZES],
                              "queued_us": (start - c[C_CREATED]) / 1000.0}}
                if r in culprits:
                    e["cname"] = "terrible"
                elif c[C_STATE] != COMPLETED:
                    e["cname"] = "bad"
                ev.append(e)
                seqs.setdefault(c[C_SEQ], []).append((r, us(start, r)))
        for s, pts in sorted(seqs.items()):
            if len(pts) < 2:
                continue
            flow_id += 1
            pts.sort(key=lambda p: p[1])
            for i, (r, ts) in enumerate(pts):
                ph = "s" if i == 0 else ("f" if i == len(pts) - 1 else "t")
                fe = {"ph": ph, "pid": r, "tid": tid, "ts": ts, "id": flow_id, "name": f"{v.name}#{s}", "cat": "match"}
                if ph != "s":
                    fe["bp"] = "e"
                ev.append(fe)
        flow_id = _p2p_events(v, tid, ev, us, dump_end, culprits, flow_id)
    for r, why in culprits.items():
        t = dump_end.get(r) or 0
        ev.append({"ph": "i", "s": "p", "pid": r, "tid": 0, "ts": us(t, r) if t else 0, "name": f"CULPRIT: {why}",
                   "cname": "terrible"})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"source": res.source, "time_zero_ns": t_min, "world_size": res.world_size,
                          "culprits": {str(k): v for k, v in culprits.items()}}}


def _p2p_events(v: PgView, tid: int, ev: list[dict[str, Any]], us: Any, dump_end: dict[int, int],
                culprits: dict[int, str], flow_id: int) -> int:
    sends: dict[tuple[int, int], list[tuple[int, float]]] = {}
    recvs: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for r, rp in v.per_rank.items():
        for p in rp.p2ps:
            if not p[P_CREATED]:
                continue
            start = p[P_CREATED]
            end = p[P_COMPLETED] if p[P_STATE] == COMPLETED and p[P_COMPLETED] else max(dump_end.get(r) or 0, start + 1000)
            e = {"ph": "X", "pid": r, "tid": tid, "name": p[P_NAME], "ts": us(start, r),
                 "dur": max((end - start) / 1000.0, 0.001), "cat": "p2p",
                 "args": {"p2p_seq": p[P_SEQ], "state": STATE_NAMES[p[P_STATE]], "peer": p[P_PEER]}}
            if r in culprits:
                e["cname"] = "terrible"
            ev.append(e)
            if p[P_PEER] >= 0:
                key = (r, p[P_PEER]) if p[P_KIND] == "send" else (p[P_PEER], r)
                (sends if p[P_KIND] == "send" else recvs).setdefault(key, []).append((p[P_SEQ], us(start, r)))
    for key, ss in sends.items():
        rr = recvs.get(key, [])
        ss.sort()
        rr.sort()
        # align from the newest: both sides still hold their recent history
        for (_, ts_s), (_, ts_r) in zip(reversed(ss), reversed(rr)):
            flow_id += 1
            ev.append({"ph": "s", "pid": key[0], "tid": tid, "ts": ts_s, "id": flow_id, "name": "p2p", "cat": "match"})
            ev.append({"ph": "f", "bp": "e", "pid": key[1], "tid": tid, "ts": ts_r, "id": flow_id, "name": "p2p",
                       "cat": "match"})
    return flow_id


def write_trace(a: Analysis, path: str) -> int:
    t = build_trace(a)
    with open(path, "w") as f:
        json.dump(t, f, separators=(",", ":"))
    return len(t["traceEvents"])
