"""Synthetic flight-recorder dumps, for tests and benchmarks.

A :class:`Job` plays a distributed program: every call issues one op (or one
coalesced group) on the ranks that take part, advancing the per-PG counters the
way ProcessGroupNCCL / frnccl do. ``dumps()`` returns one dump dict per rank in
the frnccl 3.0 format, or torch's 2.x format with ``torch_format=True``;
``write()`` lays them out on disk like the real writers.
"""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

STATES = ("scheduled", "started", "completed")
MS = 1_000_000


@dataclass
class SynPg:
    name: str
    desc: str
    ranks: tuple[int, ...]
    pg_id: int


@dataclass
class _RankState:
    rank: int
    entries: list[dict[str, Any]] = field(default_factory=list)
    record_id: int = 0
    coll_seq: dict[str, int] = field(default_factory=dict)
    p2p_seq: dict[str, int] = field(default_factory=dict)
    op_id: dict[str, int] = field(default_factory=dict)
    dropped_coll: dict[str, int] = field(default_factory=dict)
    dropped_p2p: dict[str, int] = field(default_factory=dict)
    stacks: str = ""


class Job:
    """A synthetic job of ``world_size`` ranks with a default PG named "0"."""

    def __init__(self, world_size: int, backend: str = "nccl", t0_ns: int = 1_700_000_000 * 10**9,
                 step_ns: int = 10 * MS, buffer_size: int = 2000) -> None:
        self.world_size = world_size
        self.backend = backend
        self.now = t0_ns
        self.step_ns = step_ns
        self.buffer_size = buffer_size
        self.pgs: dict[str, SynPg] = {}
        self.ranks = [_RankState(r) for r in range(world_size)]
        self.default = self.new_pg("0", range(world_size), "default_pg")

    # ---------------------------------------------------------------- groups
    def new_pg(self, name: str, ranks: Iterable[int], desc: str = "") -> SynPg:
        pg = SynPg(name, desc or f"pg_{name}", tuple(sorted(ranks)), len(self.pgs))
        self.pgs[name] = pg
        return pg

    # ---------------------------------------------------------------- ops
    def _entry(self, r: int, pg: SynPg, name: str, in_sizes: Any, out_sizes: Any, dtype: str,
               state: str, created: int, *, p2p: bool, coll_seq: int, p2p_seq: int,
               peer: int = -1, duration_ms: float | None = 1.0) -> dict[str, Any]:
        st = self.ranks[r]
        st.op_id[pg.name] = st.op_id.get(pg.name, 0) + 1
        started = created + MS // 10 if state in ("started", "completed") else 0
        completed = started + MS if state == "completed" else 0
        e: dict[str, Any] = {
            "record_id": st.record_id,
            "pg_id": pg.pg_id,
            "process_group": (pg.name, pg.desc),
            "collective_seq_id": coll_seq,
            "p2p_seq_id": p2p_seq,
            "op_id": st.op_id[pg.name],
            "profiling_name": f"{self.backend}:{name}",
            "time_created_ns": created,
            "input_sizes": in_sizes,
            "input_dtypes": [dtype] * len(in_sizes),
            "output_sizes": out_sizes,
            "output_dtypes": [dtype] * len(out_sizes),
            "is_p2p": p2p,
            "peer": peer,
            "timeout_ms": 600000,
            "state": state,
            "retired": state == "completed",
            "thread_id": "140000000000001",
            "thread_name": "MainThread",
            "time_discovered_started_ns": started,
            "time_discovered_completed_ns": completed,
            "time_gpu_started_ns": started,
            "time_gpu_completed_ns": completed,
            "frames": [{"name": "train_step", "filename": "train.py", "line": 42}],
        }
        if duration_ms is not None and state == "completed":
            e["duration_ms"] = duration_ms
        st.record_id += 1
        st.entries.append(e)
        return e

    def _tick(self) -> int:
        self.now += self.step_ns
        return self.now

    def collective(self, op: str = "all_reduce", pg: SynPg | None = None, sizes: Any = ((4, 4),),
                   dtype: str = "Float", *, ranks: Iterable[int] | None = None,
                   state: str | dict[int, str] = "completed", out_sizes: Any = None,
                   op_by_rank: dict[int, str] | None = None, sizes_by_rank: dict[int, Any] | None = None,
                   out_sizes_by_rank: dict[int, Any] | None = None,
                   dtype_by_rank: dict[int, str] | None = None, delay_ns: dict[int, int] | None = None) -> int:
        """Issue one collective on ``ranks`` (default: every member). Returns its seq id."""
        pg = pg or self.default
        t = self._tick()
        seq = 0
        for r in (pg.ranks if ranks is None else ranks):
            st = self.ranks[r]
            seq = st.coll_seq.get(pg.name, 0) + 1
            st.coll_seq[pg.name] = seq
            ins = _lists((sizes_by_rank or {}).get(r, sizes))
            outs = _lists((out_sizes_by_rank or {}).get(r, out_sizes if out_sizes is not None else sizes))
            s = state if isinstance(state, str) else state.get(r, "completed")
            self._entry(r, pg, (op_by_rank or {}).get(r, op), ins, outs, (dtype_by_rank or {}).get(r, dtype), s,
                        t + (delay_ns or {}).get(r, 0), p2p=False, coll_seq=seq, p2p_seq=0)
        return seq

    def coalesced(self, ops: Sequence[tuple[str, Any]], pg: SynPg | None = None, *, marker: str = "coalesced",
                  ranks: Iterable[int] | None = None, state: str | dict[int, str] = "completed",
                  inner_state: str = "scheduled", ops_by_rank: dict[int, Sequence[tuple[str, Any]]] | None = None,
                  out_sizes: Sequence[Any] | None = None) -> int:
        """A slow-path coalesced group: the ops share one seq id, stay ``inner_state``,
        and a ``<backend>:<marker>`` entry with the same seq closes the group with the real state."""
        pg = pg or self.default
        t = self._tick()
        seq = 0
        for r in (pg.ranks if ranks is None else ranks):
            st = self.ranks[r]
            seq = st.coll_seq.get(pg.name, 0) + 1
            st.coll_seq[pg.name] = seq
            for i, (name, sz) in enumerate((ops_by_rank or {}).get(r, ops)):
                outs = out_sizes[i] if out_sizes is not None else sz
                self._entry(r, pg, name, _lists(sz), _lists(outs), "Float", inner_state, t, p2p=False,
                            coll_seq=seq, p2p_seq=0, duration_ms=None)
            s = state if isinstance(state, str) else state.get(r, "completed")
            self._entry(r, pg, marker, [[]], [[]], "Float", s, t, p2p=False, coll_seq=seq, p2p_seq=0)
        return seq

    def p2p(self, src: int, dst: int, pg: SynPg | None = None, sizes: Any = ((8,),), *,
            send: bool = True, recv: bool = True, state: str = "completed",
            send_state: str | None = None, recv_state: str | None = None,
            recv_sizes: Any = None) -> None:
        """A send src->dst and its matching recv (either side may be left out)."""
        pg = pg or self.default
        t = self._tick()
        ls, ld = pg.ranks.index(src), pg.ranks.index(dst)
        for r, is_send in ((src, True), (dst, False)):
            if (is_send and not send) or (not is_send and not recv):
                continue
            st = self.ranks[r]
            seq = st.p2p_seq.get(pg.name, 0) + 1
            st.p2p_seq[pg.name] = seq
            cseq = 0
            if is_send:
                name, peer, s = f"send {ls}->{ld}", dst, send_state or state
                ins, outs = _lists(sizes), _lists(sizes)
            else:
                name, peer, s = f"recv {ld}<-{ls}", src, recv_state or state
                ins = outs = _lists(recv_sizes if recv_sizes is not None else sizes)
            self._entry(r, pg, name, ins, outs, "Float", s, t, p2p=True, coll_seq=cseq, p2p_seq=seq, peer=peer)

    def batch_p2p(self, pairs: Sequence[tuple[int, int]], pg: SynPg | None = None, sizes: Any = ((8,),),
                  state: str = "completed") -> None:
        """batch_isend_irecv: every rank's ops share one p2p seq and end with a coalesced marker."""
        pg = pg or self.default
        t = self._tick()
        per_rank: dict[int, list[tuple[str, int]]] = {}
        for src, dst in pairs:
            ls, ld = pg.ranks.index(src), pg.ranks.index(dst)
            per_rank.setdefault(src, []).append((f"send {ls}->{ld}", dst))
            per_rank.setdefault(dst, []).append((f"recv {ld}<-{ls}", src))
        for r, ops in sorted(per_rank.items()):
            st = self.ranks[r]
            seq = st.p2p_seq.get(pg.name, 0) + 1
            st.p2p_seq[pg.name] = seq
            for name, peer in ops:
                self._entry(r, pg, name, _lists(sizes), _lists(sizes), "Float", "scheduled", t, p2p=True,
                            coll_seq=0, p2p_seq=seq, peer=peer, duration_ms=None)
            self._entry(r, pg, "coalesced", [[]], [[]], "Float", state, t, p2p=True, coll_seq=0, p2p_seq=seq)

    # ---------------------------------------------------------------- dumps
    def set_stacks(self, rank: int, text: str) -> None:
        self.ranks[rank].stacks = text

    def truncate(self, rank: int, keep_last: int) -> None:
        """Evict the oldest entries of ``rank``'s ring buffer, keeping ``keep_last``."""
        st = self.ranks[rank]
        cut = max(0, len(st.entries) - keep_last)
        for e in st.entries[:cut]:
            name = e["process_group"][0]
            if e["is_p2p"]:
                st.dropped_p2p[name] = max(st.dropped_p2p.get(name, -1), e["p2p_seq_id"])
            else:
                st.dropped_coll[name] = max(st.dropped_coll.get(name, -1), e["collective_seq_id"])
        st.entries = st.entries[cut:]

    def dump(self, rank: int, torch_format: bool = False, incident: str = "20260101-000000-timeout-0") -> dict[str, Any]:
        st = self.ranks[rank]
        pg_config: dict[str, Any] = {}
        pg_status: dict[str, Any] = {}
        for pg in self.pgs.values():
            if rank not in pg.ranks:
                continue
            cfg: dict[str, Any] = {"name": pg.name, "desc": pg.desc, "ranks": str(list(pg.ranks))}
            coll_entries = [e for e in st.entries if e["process_group"][0] == pg.name and not e["is_p2p"]]
            p2p_entries = [e for e in st.entries if e["process_group"][0] == pg.name and e["is_p2p"]]

            def last(entries: list[dict[str, Any]], key: str, states: tuple[str, ...], floor: int) -> int:
                vals = [e[key] for e in entries if e["state"] in states]
                return max(vals) if vals else max(floor, 0)

            dc, dp = st.dropped_coll.get(pg.name, -1), st.dropped_p2p.get(pg.name, -1)
            status: dict[str, Any] = {
                "last_enqueued_collective": st.coll_seq.get(pg.name, 0),
                "last_started_collective": last(coll_entries, "collective_seq_id", ("started", "completed"), dc),
                "last_completed_collective": last(coll_entries, "collective_seq_id", ("completed",), dc),
            }
            if not torch_format:
                cfg.update(global_ranks=list(pg.ranks), backend=self.backend, timeout_ms=600000, size=len(pg.ranks))
                status.update(
                    last_enqueued_p2p=st.p2p_seq.get(pg.name, 0),
                    last_started_p2p=last(p2p_entries, "p2p_seq_id", ("started", "completed"), dp),
                    last_completed_p2p=last(p2p_entries, "p2p_seq_id", ("completed",), dp),
                    last_dropped_collective=dc, last_dropped_p2p=dp, process_group=pg.name)
            pg_config[pg.name] = cfg
            pg_status[str(pg.pg_id)] = status
        if torch_format:
            drop = ("peer", "time_gpu_started_ns", "time_gpu_completed_ns")
            entries = [{k: v for k, v in e.items() if k not in drop} for e in st.entries]
            return {"version": "2.10", "pg_config": pg_config, "pg_status": pg_status,
                    "comm_lib_version": "2.21.5", "entries": entries}
        return {
            "version": "3.0", "format": "frnccl", "pg_config": pg_config, "pg_status": pg_status,
            "comm_lib_version": "2.21.5", "entries": list(st.entries), "thread_stacks": st.stacks,
            "rank": rank, "local_rank": rank % 8, "world_size": self.world_size,
            "hostname": f"host{rank // 8}", "pid": 1000 + rank, "job_id": "synth", "attempt": 0,
            "torch_version": "2.13.0", "nccl_version": "2.21.5", "frnccl_version": "0.1.0",
            "incident_id": incident, "dump_reason": "timeout", "dump_detail": "synthetic", "trigger_rank": 0,
            "dump_time_ns": self.now + self.step_ns,
            "clock": {"source": "CLOCK_REALTIME", "realtime_ns": self.now, "monotonic_ns": 0, "store_offset_ns": 0},
            "buffer_size": self.buffer_size, "stacks_symbolized": True,
            "watchdog": {"last_heartbeat_ns": self.now, "max_discovery_lag_ms": 0.0, "mean_discovery_lag_ms": 0.0},
        }

    def write(self, root: str | os.PathLike[str], fmt: str = "pickle", ranks: Iterable[int] | None = None,
              incident: str = "20260101-000000-timeout-0") -> str:
        """Write dumps. fmt: "pickle"/"json" (frnccl layout <root>/<incident>/<fmt>/frnccl_rank_R[.json]),
        "torch" (flat <root>/nccl_trace_rank_R pickles, torch 2.10 format) or "torch_json".
        Returns the directory holding the incident (or the flat folder)."""
        rs = range(self.world_size) if ranks is None else ranks
        root = os.fspath(root)
        if fmt in ("torch", "torch_json"):
            os.makedirs(root, exist_ok=True)
            for r in rs:
                d = self.dump(r, torch_format=True)
                if fmt == "torch":
                    with open(os.path.join(root, f"nccl_trace_rank_{r}"), "wb") as f:
                        pickle.dump(d, f, protocol=2)
                else:
                    with open(os.path.join(root, f"nccl_trace_rank_{r}.json"), "w") as f:
                        json.dump(d, f)
            return root
        folder = os.path.join(root, incident, fmt)
        os.makedirs(folder, exist_ok=True)
        for r in rs:
            d = self.dump(r, incident=incident)
            if fmt == "pickle":
                with open(os.path.join(folder, f"frnccl_rank_{r}"), "wb") as f:
                    pickle.dump(d, f, protocol=2)
            else:
                with open(os.path.join(folder, f"frnccl_rank_{r}.json"), "w") as f:
                    json.dump(d, f)
        return os.path.join(root, incident)


def _lists(sizes: Any) -> list[list[int]]:
    return [list(s) for s in sizes]
