"""Synthetic flight-recorder dumps, for tests and benchmarks.

A :class:`Job` plays a distributed program: every call issues one op (or one
coalesced group) on the ranks that take part, advancing the per-PG counters the
way ProcessGroupNCCL / frnccl do. ``dumps()`` returns one dump dict per rank in
the frnccl 3.0 format, or torch's 2.x format with ``torch_format=True``;
``write()`` lays them out on disk like the real writers.

Hosts: ``ranks_per_host`` consecutive ranks share a host (and its clock); ``set_clock_offset`` shifts
every time a rank (or a host) writes, the way an NTP-synced host's wall clock is off (a rank shifted
alone runs a kernel of its own: its dumps show another boot moment); ``end_lag`` delays the ends a rank
sees, the way a watchdog's poll does. The shapes at
the end (``healthy_mesh``, ``mesh_skip``, ``pipeline_async``...) build whole jobs for tests and for
scripts/analyzer_accuracy.py.
"""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from fr_backend import compact, members

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
                 step_ns: int = 10 * MS, buffer_size: int = 2000, ranks_per_host: int = 8) -> None:
        self.world_size = world_size
        self.ranks_per_host = max(1, ranks_per_host)
        self.clock_offset: dict[int, int] = {}  # rank -> ns its host's wall clock is ahead
        # rank -> ns its observed collective ends lag the true end (the phase of a watchdog's poll)
        self.end_lag: dict[int, int] = {}
        self.t0_ns = t0_ns
        self.own_kernel: set[int] = set()  # ranks whose clock was shifted alone
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

    # ---------------------------------------------------------------- hosts and clocks
    def host(self, rank: int) -> str:
        return f"host{rank // self.ranks_per_host}"

    def set_clock_offset(self, offset_ns: int, *, rank: int | None = None, host: int | None = None) -> None:
        """Shift the clock of one rank, or of every rank of host number ``host``, by ``offset_ns``."""
        rs = [rank] if rank is not None else [r for r in range(self.world_size) if r // self.ranks_per_host == host]
        for r in rs:
            self.clock_offset[r] = offset_ns
        if rank is not None:  # a wall clock of its own: another kernel (a container of another machine)
            self.own_kernel.add(rank)

    def boot_ns(self, rank: int) -> int:
        """When the rank's kernel booted, on the unshifted wall clock: a day before the job, a second apart per
        host; a rank with a clock of its own on a kernel of its own, a day earlier still."""
        if rank in self.own_kernel:
            return self.t0_ns - 2 * 86_400 * 10**9 - rank * 10**9
        return self.t0_ns - 86_400 * 10**9 - (rank // self.ranks_per_host) * 10**9

    # ---------------------------------------------------------------- ops
    def _entry(self, r: int, pg: SynPg, name: str, in_sizes: Any, out_sizes: Any, dtype: str,
               state: str, created: int, *, p2p: bool, coll_seq: int, p2p_seq: int,
               peer: int = -1, duration_ms: float | None = 1.0, end: int = 0) -> dict[str, Any]:
        st = self.ranks[r]
        st.op_id[pg.name] = st.op_id.get(pg.name, 0) + 1
        started = created + MS // 10 if state in ("started", "completed") else 0
        completed = (end or started + MS) if state == "completed" else 0
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
        who = list(pg.ranks if ranks is None else ranks)
        # members leave a collective together: when the last one arrived, plus its duration
        end = t + max((delay_ns or {}).get(r, 0) for r in who) + MS // 10 + MS if who else 0
        for r in who:
            st = self.ranks[r]
            seq = st.coll_seq.get(pg.name, 0) + 1
            st.coll_seq[pg.name] = seq
            ins = _lists((sizes_by_rank or {}).get(r, sizes))
            outs = _lists((out_sizes_by_rank or {}).get(r, out_sizes if out_sizes is not None else sizes))
            s = state if isinstance(state, str) else state.get(r, "completed")
            self._entry(r, pg, (op_by_rank or {}).get(r, op), ins, outs, (dtype_by_rank or {}).get(r, dtype), s,
                        t + (delay_ns or {}).get(r, 0), p2p=False, coll_seq=seq, p2p_seq=0,
                        end=end + self.end_lag.get(r, 0))
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
        off = self.clock_offset.get(rank, 0)
        entries_out = [_shift(e, off) for e in st.entries] if off else list(st.entries)
        pg_config: dict[str, Any] = {}
        pg_status: dict[str, Any] = {}
        for pg in self.pgs.values():
            if rank not in pg.ranks:
                continue
            # torch's ranks string, or frnccl's members text as its writer makes it
            cfg: dict[str, Any] = ({"name": pg.name, "desc": pg.desc, "ranks": str(list(pg.ranks))} if torch_format
                                   else {"name": pg.name, "desc": pg.desc, "members": members.encode(list(pg.ranks))})
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
                cfg.update(backend=self.backend, timeout_ms=600000, size=len(pg.ranks))
                status.update(
                    last_enqueued_p2p=st.p2p_seq.get(pg.name, 0),
                    last_started_p2p=last(p2p_entries, "p2p_seq_id", ("started", "completed"), dp),
                    last_completed_p2p=last(p2p_entries, "p2p_seq_id", ("completed",), dp),
                    last_dropped_collective=dc, last_dropped_p2p=dp, process_group=pg.name)
            pg_config[pg.name] = cfg
            pg_status[str(pg.pg_id)] = status
        if torch_format:
            drop = ("peer", "time_gpu_started_ns", "time_gpu_completed_ns")
            entries = [{k: v for k, v in e.items() if k not in drop} for e in entries_out]
            return {"version": "2.10", "pg_config": pg_config, "pg_status": pg_status,
                    "comm_lib_version": "2.21.5", "entries": entries}
        return {
            "version": "3.0", "format": "frnccl", "pg_config": pg_config, "pg_status": pg_status,
            "comm_lib_version": "2.21.5", "entries": entries_out, "thread_stacks": st.stacks,
            "rank": rank, "local_rank": rank % self.ranks_per_host, "world_size": self.world_size,
            "hostname": self.host(rank), "pid": 1000 + rank, "job_id": "synth", "attempt": 0,
            "torch_version": "2.13.0", "nccl_version": "2.21.5", "frnccl_version": "0.1.0",
            "incident_id": incident, "dump_reason": "timeout", "dump_detail": "synthetic", "trigger_rank": 0,
            "dump_time_ns": self.now + self.step_ns + off,
            # the kernel's monotonic clock is not shifted with the wall clock: a rank shifted alone is a clock of its own
            "clock": {"source": "CLOCK_REALTIME", "realtime_ns": self.now + self.step_ns + off,
                      "monotonic_ns": self.now + self.step_ns - self.boot_ns(rank)},
            "buffer_size": self.buffer_size, "stacks_symbolized": True,
            "watchdog": {"last_heartbeat_ns": self.now, "max_discovery_lag_ms": 0.0, "mean_discovery_lag_ms": 0.0},
        }

    def dump_torch215_gloo(self, rank: int, newest_ended: bool = True) -> dict[str, Any]:
        """Rank's dump as torch 2.15's recorder writes it for gloo groups (``_dump_fr_trace_file`` after the
        rank's own gloo error): every entry 'scheduled' with no discovery times, retired once it ended;
        pg_status keyed by the process-local group id, counting an op that ended as completed whether it
        completed or failed (an op left 'started' here is one that failed; with ``newest_ended`` False, the
        rank's newest op, if left 'started', had not ended when it dumped, as happens too); pg_config one
        group under the empty name, the members of the first group created after the default one, on every
        rank (wrong for most). See test/workers/torch215_recorder.py."""
        d = self.dump(rank, torch_format=True)
        local = {str(pg.pg_id): str(i) for i, pg in enumerate(p for p in self.pgs.values() if rank in p.ranks)}
        newest = d["entries"][-1]["record_id"] if d["entries"] else -1
        status: dict[str, Any] = {}
        for e in d["entries"]:
            failed = e["state"] == "started" and (newest_ended or e["record_id"] != newest)
            ended = e["state"] == "completed" or failed
            e.update(pg_id=int(local[str(e["pg_id"])]), state="scheduled", retired=ended, thread_name="python",
                     time_discovered_started_ns=None, time_discovered_completed_ns=None,
                     process_group=(e["process_group"][0], "default_pg" if e["pg_id"] == 0 else "undefined"))
            e.pop("duration_ms", None)
            st = status.setdefault(str(e["pg_id"]), {"last_enqueued_collective": 0, "last_started_collective": -1,
                                                    "last_completed_collective": 0})
            st["last_enqueued_collective"] = max(st["last_enqueued_collective"], e["collective_seq_id"])
            if ended:
                st["last_completed_collective"] = max(st["last_completed_collective"], e["collective_seq_id"])
        first = next((pg for pg in self.pgs.values() if pg is not self.default), self.default)
        d["pg_config"] = {"": {"name": "", "desc": "", "ranks": str(list(first.ranks))}}
        d["pg_status"] = status
        d["comm_lib_version"] = ""
        return d

    def write(self, root: str | os.PathLike[str], fmt: str = "pickle", ranks: Iterable[int] | None = None,
              incident: str = "20260101-000000-timeout-0", newest_ended: bool = True) -> str:
        """Write dumps. fmt: "compact"/"pickle"/"json" (frnccl layout
        <root>/<incident>/<fmt>/frnccl_rank_R[.json.gz|.json]),
        "torch" (flat <root>/nccl_trace_rank_R pickles, torch 2.10 format), "torch_json" or "torch215_gloo"
        (pickles as torch 2.15's recorder writes them for gloo groups, dump_torch215_gloo).
        Returns the directory holding the incident (or the flat folder)."""
        rs = range(self.world_size) if ranks is None else ranks
        root = os.fspath(root)
        if fmt in ("torch", "torch_json", "torch215_gloo"):
            os.makedirs(root, exist_ok=True)
            for r in rs:
                if fmt == "torch215_gloo":
                    d = self.dump_torch215_gloo(r, newest_ended)
                else:
                    d = self.dump(r, torch_format=True)
                if fmt != "torch_json":
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
            elif fmt == "compact":
                with open(os.path.join(folder, f"frnccl_rank_{r}.json.gz"), "wb") as f:
                    f.write(compact.encode(d, level=1))
            else:
                with open(os.path.join(folder, f"frnccl_rank_{r}.json"), "w") as f:
                    json.dump(d, f)
        return os.path.join(root, incident)


def _lists(sizes: Any) -> list[list[int]]:
    return [list(s) for s in sizes]


_TIME_KEYS = ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns",
              "time_gpu_started_ns", "time_gpu_completed_ns")


def _shift(e: dict[str, Any], off: int) -> dict[str, Any]:
    """An entry as a host whose clock is ``off`` ns ahead writes it (unknown times stay 0)."""
    d = dict(e)
    for k in _TIME_KEYS:
        if d.get(k):
            d[k] += off
    return d



# ---------------------------------------------------------------------------- shapes of whole jobs
# Each returns (job, culprits): the ranks a right verdict names (empty for a healthy job).

COMPUTE_STACK = ('Thread 0x7f0000000001 (most recent call first):\n'
                 '  File "/job/model.py", line 212 in forward\n  File "/job/train.py", line 90 in step\n')
COMM_STACK = ('Thread 0x7f0000000001 (most recent call first):\n'
              '  File "/env/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2950 in '
              'all_reduce\n  File "/job/train.py", line 95 in step\n')


def host_offsets(job: Job, max_ms: float) -> None:
    """Every host's clock off by a different amount in [-max_ms, +max_ms] (host 0 too)."""
    hosts = (job.world_size + job.ranks_per_host - 1) // job.ranks_per_host
    for h in range(hosts):
        frac = ((h * 7 + 3) % 11 - 5) / 5  # -1 .. 1, spread over the hosts
        job.set_clock_offset(int(frac * max_ms * MS), host=h)


def _jitter(job: Job, rng: Any, ranks: Iterable[int], max_us: int = 200) -> dict[int, int]:
    return {r: rng.randrange(max_us * 1000) for r in ranks}


def mesh(n: int, tp: int = 4, ranks_per_host: int = 4) -> tuple[Job, list[SynPg], list[SynPg]]:
    """A TP x DP mesh: TP groups of ``tp`` consecutive ranks (one host), DP groups across them."""
    j = Job(n, ranks_per_host=ranks_per_host)
    tps = [j.new_pg(str(1 + i), range(i * tp, (i + 1) * tp), "mesh_tp") for i in range(n // tp)]
    dps = [j.new_pg(str(1 + n // tp + k), range(k, n, tp), "mesh_dp") for k in range(tp)]
    return j, tps, dps


def _mesh_step(j: Job, tps: list[SynPg], dps: list[SynPg], rng: Any, late: dict[int, int] | None = None) -> None:
    for g in tps:
        j.collective("all_reduce", g, sizes=[[1024]], delay_ns={**_jitter(j, rng, g.ranks), **(late or {})})
    for g in dps:
        j.collective("all_reduce", g, sizes=[[4096]], delay_ns=_jitter(j, rng, g.ranks))
    j.collective("all_reduce", sizes=[[1]], delay_ns=_jitter(j, rng, range(j.world_size)))


def healthy_mesh(n: int, steps: int = 40, offset_ms: float = 5.0, seed: int = 0) -> tuple[Job, list[int]]:
    """Nothing is slow; host clocks are off by up to +-offset_ms."""
    import random

    rng = random.Random(seed)
    j, tps, dps = mesh(n)
    for _ in range(steps):
        _mesh_step(j, tps, dps, rng)
    host_offsets(j, offset_ms)
    return j, []


def straggler_mesh(n: int, slow: int, steps: int = 40, offset_ms: float = 5.0, seed: int = 0
                   ) -> tuple[Job, list[int]]:
    """Rank ``slow`` reaches every TP all_reduce 5 ms after its peers; host clocks are off by up to +-offset_ms."""
    import random

    rng = random.Random(seed)
    j, tps, dps = mesh(n)
    for _ in range(steps):
        _mesh_step(j, tps, dps, rng, late={slow: 5 * MS})
    host_offsets(j, offset_ms)
    return j, [slow]


def mesh_skip(n: int, bad: int, steps: int = 20, offset_ms: float = 5.0, seed: int = 0, tp: int = 4
              ) -> tuple[Job, list[int]]:
    """Skip and go on: in the last step rank ``bad`` skips its TP all_reduce; its DP group completes its
    DP all_reduce (every member present) and they wait in the world all_reduce; bad's TP peers wait in
    the TP all_reduce, the other DP groups in their DP all_reduce for those peers. A cycle."""
    import random

    rng = random.Random(seed)
    j, tps, dps = mesh(n, tp)
    for _ in range(steps):
        _mesh_step(j, tps, dps, rng)
    t_bad = tps[bad // tp]
    j.collective("all_reduce", t_bad, sizes=[[1024]], ranks=[r for r in t_bad.ranks if r != bad], state="started")
    for g in tps:
        if g is not t_bad:
            j.collective("all_reduce", g, sizes=[[1024]])
    for g in dps:
        if bad in g.ranks:
            j.collective("all_reduce", g, sizes=[[4096]])
        else:
            j.collective("all_reduce", g, sizes=[[4096]], ranks=[r for r in g.ranks if r not in t_bad.ranks],
                         state="started")
    d_bad = next(g for g in dps if bad in g.ranks)
    j.collective("all_reduce", sizes=[[1]], ranks=list(d_bad.ranks), state="started")
    for r in range(n):
        j.set_stacks(r, COMM_STACK)
    j.set_stacks(bad, COMM_STACK)  # waits in the world all_reduce like its DP peers: only the order tells
    host_offsets(j, offset_ms)
    return j, [bad]


def pipeline_async(n: int, bad: int, steps: int = 20, offset_ms: float = 5.0, bad_isend: bool = True
                   ) -> tuple[Job, list[int]]:
    """Pipeline pairs (2k -> 2k+1) and a world all_reduce per step. In the last step the stage-1 rank
    ``bad`` (odd) posts its gradient isend back to its stage-0 peer and then hangs in compute before the
    recv of the next activation; the peer posted that activation's isend and went on to the world
    all_reduce. Every rank but ``bad`` waits in the all_reduce; bad's and its peer's sends are unmatched.
    ``bad_isend=False``: bad hangs before its own isend too (nothing pending on it: no cycle)."""
    assert bad % 2 == 1
    j = Job(n, ranks_per_host=4)
    pps = [j.new_pg(str(1 + k), [2 * k, 2 * k + 1], "pp") for k in range(n // 2)]
    for _ in range(steps):
        for g in pps:
            j.p2p(g.ranks[0], g.ranks[1], pg=g)  # activation
            j.p2p(g.ranks[1], g.ranks[0], pg=g)  # gradient
        j.collective("all_reduce", sizes=[[1]])
    peer = bad - 1
    g_bad = pps[peer // 2]
    for g in pps:
        if g is not g_bad:
            j.p2p(g.ranks[0], g.ranks[1], pg=g)
            j.p2p(g.ranks[1], g.ranks[0], pg=g)
    if bad_isend:
        j.p2p(bad, peer, pg=g_bad, recv=False, state="scheduled")  # bad: isend of the gradient, then compute
    j.p2p(peer, bad, pg=g_bad, recv=False, state="scheduled")  # peer: isend of the activation, then all_reduce
    j.collective("all_reduce", sizes=[[1]], ranks=[r for r in range(n) if r != bad], state="started")
    for r in range(n):
        j.set_stacks(r, COMM_STACK)
    j.set_stacks(bad, COMPUTE_STACK)
    host_offsets(j, offset_ms)
    return j, [bad]


FAULT_KINDS = ("skip", "hang", "size")


def mesh_faults(n: int, faults: dict[int, str], steps: int = 20, offset_ms: float = 5.0, seed: int = 0, tp: int = 4
                ) -> tuple[Job, list[int]]:
    """Several independent faults in the last step of a TP x DP mesh, one per rank of ``faults``:
    ``skip``: it skips its TP all_reduce and goes on (as in ``mesh_skip``); ``hang``: it hangs in compute before
    its TP all_reduce (issues nothing more); ``size``: it issues its TP all_reduce with a different size (the op
    hangs in its group). Each rank goes as far as the others let it: a TP op completes only if every member
    issued it alike, a DP op only if every member reached it, the world all_reduce never."""
    import random

    assert set(faults.values()) <= set(FAULT_KINDS), faults
    rng = random.Random(seed)
    j, tps, dps = mesh(n, tp)
    for _ in range(steps):
        _mesh_step(j, tps, dps, rng)
    passed_tp: set[int] = set()
    for g in tps:
        issue = [r for r in g.ranks if faults.get(r) not in ("skip", "hang")]
        ok = len(issue) == len(g.ranks) and not any(faults.get(r) == "size" for r in g.ranks)
        j.collective("all_reduce", g, sizes=[[1024]], ranks=issue, state="completed" if ok else "started",
                     sizes_by_rank={r: [[512]] for r in g.ranks if faults.get(r) == "size"})
        passed_tp.update(g.ranks if ok else [r for r in g.ranks if faults.get(r) == "skip"])
    passed_dp: set[int] = set()
    for g in dps:
        issue = [r for r in g.ranks if r in passed_tp]
        ok = len(issue) == len(g.ranks)
        if issue:
            j.collective("all_reduce", g, sizes=[[4096]], ranks=issue, state="completed" if ok else "started")
        if ok:
            passed_dp.update(g.ranks)
    j.collective("all_reduce", sizes=[[1]], ranks=sorted(passed_dp), state="started")
    for r in range(n):
        j.set_stacks(r, COMPUTE_STACK if faults.get(r) == "hang" else COMM_STACK)
    host_offsets(j, offset_ms)
    return j, sorted(faults)


def gloo_pairs_fault(shape: str, steps: int = 5) -> tuple[Job, list[int]]:
    """4 gloo ranks, pair groups {0,1} and {2,3}: each step an all_reduce in the rank's pair, then one in the
    world group; after ``steps`` good steps, one fault (the shapes of test/workers/torch215_recorder.py):
      skip      rank 3 skips its pair all_reduce and goes on to the world all_reduce;
      hang      rank 1 hangs in compute before its pair all_reduce;
      size      rank 3's pair all_reduce is twice the size of rank 2's (gloo fails both; neither goes on).
    Ops that fail are left 'started' (dump_torch215_gloo then claims them completed, as torch 2.15 does)."""
    j = Job(4, backend="gloo")
    a, b = j.new_pg("1", [0, 1]), j.new_pg("2", [2, 3])
    for _ in range(steps):
        j.collective(pg=a, sizes=[[8]])
        j.collective(pg=b, sizes=[[8]])
        j.collective(sizes=[[4]])
    if shape == "skip":
        j.collective(pg=a, sizes=[[8]])
        j.collective(pg=b, sizes=[[8]], ranks=[2], state="started")
        j.collective(sizes=[[4]], ranks=[0, 1, 3], state="started")
        return j, [3]
    if shape == "hang":
        j.collective(pg=a, sizes=[[8]], ranks=[0], state="started")
        j.collective(pg=b, sizes=[[8]])
        j.collective(sizes=[[4]], ranks=[2, 3], state="started")
        return j, [1]
    if shape == "size":
        j.collective(pg=a, sizes=[[8]])
        j.collective(pg=b, sizes=[[8]], sizes_by_rank={3: [[16]]}, out_sizes_by_rank={3: [[16]]},
                     state="started")
        j.collective(sizes=[[4]], ranks=[0, 1], state="started")
        return j, [3]
    raise ValueError(f"unknown shape {shape!r}")
