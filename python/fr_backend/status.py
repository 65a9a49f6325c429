"""`frnccl status --store HOST:PORT [--json]`: where every rank of a running job is, per group, from the
ranks' live summaries (backend/RankSummary.hpp), asked for through the job's store. Writes no dump, opens no
incident, aborts nothing: each rank's monitor answers on its next poll, which the request's wake brings at
once, under one key per rank that the next request overwrites.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from .analyzer.fmt import clean, ranks_str
from .live_dump import LiveDumpError, open_job, registered_world_size, wake_all
from .slow import STATE_KEY as LATENESS_KEY

SEQ_KEY = "frnccl/status/seq"
READ_BATCH = 1024
MAX_ANSWER = 8192  # a summary is at most 2 KB: anything larger is not a rank's
MAX_TIMEOUT_S = 600.0


def answer_key(rank: int) -> str:
    return f"frnccl/status/rank/{rank}"


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("status", help="where every rank of a running job is, per group (no dump)")
    p.add_argument("--store", required=True, metavar="HOST:PORT",
                   help="the job's store: MASTER_ADDR:MASTER_PORT, or torchrun's --rdzv-endpoint")
    p.add_argument("--world-size", type=int, default=0, help="ranks to ask (default: what the job reports)")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for the ranks' answers (0 < T <= 600)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _str(v: Any, limit: int = 200) -> str:
    """A name from a rank's answer, fit to print: a string, escaped and cut; anything else is ''."""
    return clean(v[:limit]) if isinstance(v, str) else ""


def _int(v: Any) -> int | None:
    return v if type(v) is int else None


@dataclass
class GroupView:
    name: str
    desc: str = ""
    ops: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its op in flight (summary_op)
    completed: dict[int, int] = field(default_factory=dict)  # rank -> last completed collective seq


@dataclass
class Lateness:
    """The slow-rank detector's latest window, as rank 0 posted it (fr_backend.slow.STATE_KEY)."""

    window_s: float = 0.0
    slow: list[int] = field(default_factory=list)
    groups: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # group -> [{rank, late_ms, share}]


def _num(v: Any) -> float | None:
    return float(v) if type(v) in (int, float) and abs(v) < 1e12 else None


def parse_lateness(raw: bytes) -> Lateness | None:
    """The detector's state, each field checked; None where it is not that (anything may be in the store)."""
    if len(raw) > 1 << 20:
        return None
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("groups"), dict):
        return None
    out = Lateness(window_s=_num(obj.get("window_s")) or 0.0,
                   slow=[r for r in obj.get("slow", []) if _int(r) is not None][:64] if isinstance(obj.get("slow"), list) else [])
    for name, late in list(obj["groups"].items())[:256]:
        rows = []
        for x in late[:8] if isinstance(late, list) else []:
            if isinstance(x, dict) and _int(x.get("rank")) is not None and _num(x.get("late_ms")) is not None \
                    and _num(x.get("share")) is not None:
                rows.append({"rank": x["rank"], "late_ms": _num(x["late_ms"]), "share": _num(x["share"])})
        out.groups[_str(name)] = rows
    return out


@dataclass
class Status:
    world: int
    answered: dict[int, dict[str, Any]]  # rank -> its summary
    seconds: float
    lateness: Lateness | None = None

    def missing(self) -> list[int]:
        return [r for r in range(self.world) if r not in self.answered]

    def groups(self) -> dict[str, GroupView]:
        out: dict[str, GroupView] = {}
        for r, s in sorted(self.answered.items()):
            groups = s.get("groups")
            for g in groups if isinstance(groups, list) else []:
                if not isinstance(g, dict):
                    continue
                name = _str(g.get("pg"))
                v = out.setdefault(name, GroupView(name, _str(g.get("desc"))))
                done = g.get("completed")
                v.completed[r] = (_int(done.get("seq")) or 0) if isinstance(done, dict) else 0
                op = g.get("in_flight")
                if isinstance(op, dict):
                    # only the fields shown, each of its type: a hostile answer prints nothing else
                    v.ops[r] = {"op": _str(op.get("op"), 48), "seq": _int(op.get("seq")),
                                "created_ns": _int(op.get("created_ns"))}
        return out


def ask(endpoint: str, world_size: int, timeout: float) -> Status:
    """Raises LiveDumpError (one line) for a store that fails on the way or a job of another size."""
    store, world = open_job(endpoint, world_size)
    try:
        if world_size and store.check(["frnccl/world_size"]):
            registered = registered_world_size(store)
            if registered != world_size:
                raise LiveDumpError(f"--world-size {world_size} does not match the job's {registered} ranks")
        start = time.monotonic()
        _check_counter(store)
        n = int(store.add(SEQ_KEY, 1))
        wake_all(store, world)
        st = _collect(store, world, n, start, timeout)
        if store.check([LATENESS_KEY]):
            st.lateness = parse_lateness(store.get(LATENESS_KEY))
        return st
    except LiveDumpError:
        raise
    except Exception as err:  # the store failed or dropped us mid-way (torch raises several types)
        raise LiveDumpError(f"the store failed while asking: {clean(str(err).splitlines()[0][:200]) if str(err) else type(err).__name__}") from None


def _check_counter(store: Any) -> None:
    """The store server fails an add() on a value that is not a number, drops the connection and logs a C++
    backtrace: the counter is read first (a compare_set expecting what nobody writes reads without setting)."""
    unset = "\x00frnccl-unset"
    raw = store.compare_set(SEQ_KEY, unset, unset).decode("utf-8", "replace")
    if raw != unset and not re.fullmatch(r"-?\d{1,19}", raw):
        raise LiveDumpError(f"{SEQ_KEY} in the store is not a number ({clean(raw[:80])!r}): delete it to ask again")


def _collect(store: Any, world: int, n: int, start: float, timeout: float) -> Status:
    """The answers to request ``n`` (or a newer one's): one multi_get per batch of keys known present each
    pass; keys not there yet are looked for a batch at once, and one by one only on the last pass."""
    answered: dict[int, dict[str, Any]] = {}
    present: set[int] = set()
    pause = 0.02
    while True:
        last = time.monotonic() - start >= timeout
        todo = [r for r in range(world) if r not in answered]
        absent = [r for r in todo if r not in present]
        for i in range(0, len(absent), READ_BATCH):
            batch = absent[i:i + READ_BATCH]
            # One round trip per batch and pass; a batch not there whole is asked key by key only on the last
            # pass: doing so every pass would cost a round trip per rank (16,384 at that size) while the ranks
            # are still answering, seconds of the store's time per pass.
            if store.check([answer_key(r) for r in batch]):
                present.update(batch)
            elif last:
                present.update(r for r in batch if store.check([answer_key(r)]))
        ready = [r for r in todo if r in present]
        for i in range(0, len(ready), READ_BATCH):
            batch = ready[i:i + READ_BATCH]
            for r, raw in zip(batch, store.multi_get([answer_key(r) for r in batch])):
                got = _answer(raw, n, r, world)
                if got is not None:
                    answered[r] = got
        if len(answered) == world or last:
            return Status(world, answered, time.monotonic() - start)
        time.sleep(min(pause, max(0.0, start + timeout - time.monotonic())))
        pause = min(pause * 2, 0.2)


def _answer(raw: bytes, n: int, rank: int, world: int) -> dict[str, Any] | None:
    """The summary of request ``n`` or a newer one from ``rank``, or None (an earlier request's, or not an
    answer). A rank of a job of another size: LiveDumpError."""
    if len(raw) > MAX_ANSWER:
        return None
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    got = obj.get("n") if isinstance(obj, dict) else None
    s = obj.get("summary") if type(got) is int and got >= n else None
    if not isinstance(s, dict) or _int(s.get("rank")) != rank:
        return None
    size = _int(s.get("world_size"))
    if size is not None and size != world:
        raise LiveDumpError(f"rank {rank} answers for a job of {size} ranks, not {world}: give --world-size {size}")
    return s


def _op_text(op: dict[str, Any], now_ns: int) -> str:
    created = op.get("created_ns")
    age = f" for {(now_ns - created) / 1e9:.1f} s" if isinstance(created, int) and 0 < created <= now_ns else ""
    seq = op.get("seq")
    return f"{op.get('op') or '?'} seq {seq if isinstance(seq, int) else '?'}{age}"


def render(st: Status) -> str:
    now = time.time_ns()
    lines = [f"frnccl status: {len(st.answered)}/{st.world} ranks answered in {st.seconds:.1f} s"]
    if st.missing():
        lines.append(f"  did not answer: ranks {ranks_str(st.missing())}")
    for name, g in sorted(st.groups().items()):
        lines.append(f"group {name} ({g.desc[:48]}):")  # both escaped as read (GroupView)
        if not g.ops:
            lines.append(f"  no rank inside an op; last completed seq {max(g.completed.values(), default=0)}")
            continue
        by_op: dict[str, list[int]] = {}
        for r, op in sorted(g.ops.items()):
            by_op.setdefault(_op_text(op, now), []).append(r)
        for text, rs in by_op.items():
            lines.append(f"  ranks {ranks_str(rs)} in {text}")
        newest = max(g.completed.values(), default=0)
        behind = sorted(r for r, c in g.completed.items() if c < newest and r not in g.ops)
        if behind:
            lines.append(f"  behind (last completed seq below {newest}, inside no op): ranks {ranks_str(behind)}")
    if st.lateness is not None:
        lines += _lateness_lines(st.lateness)
    return "\n".join(lines)


def _lateness_lines(late: Lateness) -> list[str]:
    slow = set(late.slow)
    lines = [f"slow ranks (named in the job's log): {ranks_str(sorted(slow)) if slow else 'none'}"]
    for name, rows in sorted(late.groups.items(), key=lambda kv: (not any(x["rank"] in slow for x in kv[1]), kv[0])):
        rows = sorted(rows, key=lambda x: (x["rank"] not in slow, -x["share"]))
        shown = ", ".join(f"rank {x['rank']} {max(0.0, x['late_ms']):.1f} ms ({x['share']:.0%})" for x in rows[:4])
        lines.append(f"  lateness in group {name} over the last {late.window_s:g} s window (on median, above its start; "
                     f"share of the others' time): {shown or 'no rank late'}")
    return lines


def run(args: argparse.Namespace) -> int:
    if not 0 < args.timeout <= MAX_TIMEOUT_S:  # false for nan too
        print(f"frnccl: --timeout {args.timeout} is not a number of seconds in (0, {MAX_TIMEOUT_S:g}]", file=sys.stderr)
        return 2
    try:
        st = ask(args.store, args.world_size, args.timeout)
    except LiveDumpError as err:
        print(f"frnccl: {err}", file=sys.stderr)
        return 2
    if args.json:
        groups = {name: {"desc": g.desc, "in_flight": {str(r): op for r, op in sorted(g.ops.items())},
                         "last_completed": {str(r): c for r, c in sorted(g.completed.items())}}
                  for name, g in sorted(st.groups().items())}
        lateness = None if st.lateness is None else {"window_s": st.lateness.window_s, "slow": st.lateness.slow,
                                                     "groups": st.lateness.groups}
        print(json.dumps({"world_size": st.world, "answered": sorted(st.answered), "missing": st.missing(),
                          "seconds": round(st.seconds, 3), "groups": groups, "lateness": lateness}))
    else:
        print(render(st))
    return 0 if not st.missing() else 1
