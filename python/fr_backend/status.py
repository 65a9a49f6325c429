"""`frnccl status --store HOST:PORT [--json]`: where every rank of a running job is, per group, from the
ranks' live summaries (backend/RankSummary.hpp), asked for through the job's store. Writes no dump, opens no
incident, aborts nothing: each rank's monitor answers on its next poll, which the request's wake brings at
once, under one key per rank that the next request overwrites.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from .analyzer.fmt import ranks_str
from .live_dump import LiveDumpError, open_job, wake_all

SEQ_KEY = "frnccl/status/seq"
READ_BATCH = 1024
MAX_ANSWER = 8192  # a summary is at most 2 KB: anything larger is not a rank's


def answer_key(rank: int) -> str:
    return f"frnccl/status/rank/{rank}"


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("status", help="where every rank of a running job is, per group (no dump)")
    p.add_argument("--store", required=True, metavar="HOST:PORT",
                   help="the job's store: MASTER_ADDR:MASTER_PORT, or torchrun's --rdzv-endpoint")
    p.add_argument("--world-size", type=int, default=0, help="ranks to ask (default: what the job reports)")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for the ranks' answers")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


@dataclass
class GroupView:
    name: str
    desc: str = ""
    ops: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its op in flight (summary_op)
    completed: dict[int, int] = field(default_factory=dict)  # rank -> last completed collective seq


@dataclass
class Status:
    world: int
    answered: dict[int, dict[str, Any]]  # rank -> its summary
    seconds: float

    def missing(self) -> list[int]:
        return [r for r in range(self.world) if r not in self.answered]

    def groups(self) -> dict[str, GroupView]:
        out: dict[str, GroupView] = {}
        for r, s in sorted(self.answered.items()):
            for g in s.get("groups") or []:
                if not isinstance(g, dict):
                    continue
                v = out.setdefault(str(g.get("pg", "")), GroupView(str(g.get("pg", "")), str(g.get("desc", ""))))
                done = g.get("completed")
                v.completed[r] = done.get("seq", 0) if isinstance(done, dict) and isinstance(done.get("seq"), int) else 0
                if isinstance(g.get("in_flight"), dict):
                    v.ops[r] = g["in_flight"]
        return out


def ask(endpoint: str, world_size: int, timeout: float) -> Status:
    store, world = open_job(endpoint, world_size)
    start = time.monotonic()
    n = int(store.add(SEQ_KEY, 1))
    wake_all(store, world)
    answered: dict[int, dict[str, Any]] = {}
    pause = 0.02
    while True:
        last = time.monotonic() - start >= timeout
        todo = [r for r in range(world) if r not in answered]
        for i in range(0, len(todo), READ_BATCH):
            batch = todo[i:i + READ_BATCH]
            # One round trip per batch and poll; a batch not there whole is asked key by key only on the last
            # poll: every poll doing so would cost a round trip per rank (16,384 at that size) while the ranks
            # are still answering, seconds of the store's time per poll.
            if not store.check([answer_key(r) for r in batch]):
                if not last:
                    continue
                batch = [r for r in batch if store.check([answer_key(r)])]
            for r, raw in zip(batch, store.multi_get([answer_key(r) for r in batch]) if batch else []):
                got = _answer(raw, n, r)
                if got is not None:
                    answered[r] = got
        if len(answered) == world or last:
            return Status(world, answered, time.monotonic() - start)
        time.sleep(min(pause, max(0.0, start + timeout - time.monotonic())))
        pause = min(pause * 2, 0.2)


def _answer(raw: bytes, n: int, rank: int) -> dict[str, Any] | None:
    """The summary of request ``n`` from ``rank``, or None (an earlier request's, or not an answer)."""
    if len(raw) > MAX_ANSWER:
        return None
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    s = obj.get("summary") if isinstance(obj, dict) and obj.get("n") == n else None
    return s if isinstance(s, dict) and s.get("rank") == rank else None


def _op_text(op: dict[str, Any], now_ns: int) -> str:
    created = op.get("created_ns")
    age = f" for {(now_ns - created) / 1e9:.1f} s" if isinstance(created, int) and 0 < created <= now_ns else ""
    seq = op.get("seq")
    return f"{str(op.get('op', '?'))[:48]} seq {seq if isinstance(seq, int) else '?'}{age}"


def render(st: Status) -> str:
    now = time.time_ns()
    lines = [f"frnccl status: {len(st.answered)}/{st.world} ranks answered in {st.seconds:.1f} s"]
    if st.missing():
        lines.append(f"  did not answer: ranks {ranks_str(st.missing())}")
    for name, g in sorted(st.groups().items()):
        lines.append(f"group {name} ({g.desc[:48]}):")
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
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        st = ask(args.store, args.world_size, args.timeout)
    except LiveDumpError as err:
        print(f"frnccl: {err}", file=sys.stderr)
        return 2
    if args.json:
        groups = {name: {"desc": g.desc, "in_flight": {str(r): op for r, op in sorted(g.ops.items())},
                         "last_completed": {str(r): c for r, c in sorted(g.completed.items())}}
                  for name, g in sorted(st.groups().items())}
        print(json.dumps({"world_size": st.world, "answered": sorted(st.answered), "missing": st.missing(),
                          "seconds": round(st.seconds, 3), "groups": groups}))
    else:
        print(render(st))
    return 0 if not st.missing() else 1
