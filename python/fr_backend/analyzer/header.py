"""What a summary takes from a dump besides its entries: its header, pg_config (the groups and their
members), pg_status (each group's counters) and the callers of its newest ops; and the steps after
the entries that both readers share (failed ops, states gloo never updates).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from itertools import compress, pairwise, repeat
from operator import and_, eq, is_, ne
from typing import Any

from fr_backend import members, schema

from .fields import MAX_RANKS, as_i64, as_int, as_ns, state_code
from .model import COMPLETED, DumpError, ExitInfo, LastOp, RankPg, RankSummary

FRAMES_KEPT = 16  # callers of a rank's newest entries, kept for the evidence of findings
# The exit note's fields as the writer bounds them (backend/ExitNote.hpp), with room for its "...".
EXIT_FIELD_MAX = {"type": 256, "message": 1024, "frame": 512, "traceback": 4096}
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")


def exit_info(raw: Any) -> ExitInfo | None:
    """The dump's ``exit`` (absent in older dumps, {} when the rank did not leave with an exception).
    A field of another type is dropped; control characters a hand-made file carries are escaped."""
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str) or not raw["type"]:
        return None

    def text(key: str, one_line: bool) -> str:
        v = raw.get(key)
        v = v[:EXIT_FIELD_MAX[key]] if isinstance(v, str) else ""
        v = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", v)
        return v.replace("\n", "\\x0a") if one_line else v

    t = raw.get("time_ns")
    time_ns = t if type(t) is int and 0 <= t < 1 << 63 else 0
    return ExitInfo(text("type", True), text("message", False), text("frame", True), text("traceback", False), time_ns)


def kernel_boot_ns(clock: Any) -> int | None:
    """When the writer's kernel booted, on its wall clock: ``realtime_ns - monotonic_ns``, read together at dump
    time. Every process of one kernel reads the same two clocks, so ranks with equal values share one wall clock,
    however far apart their collectives' observed ends put them. None when the dump does not tell (torch's dumps,
    an older writer, values that are not plausible clock readings)."""
    if not isinstance(clock, dict):
        return None
    real, mono = clock.get("realtime_ns"), clock.get("monotonic_ns")
    if type(real) is not int or type(mono) is not int or not 0 < mono < real < 1 << 63:
        return None
    return real - mono


JOB_TAG = re.compile(r"[0-9a-f]{8}")  # the writer's jobTag (backend/IncidentId.hpp)


def job_tag(value: Any) -> str:
    """The dump's job tag, or "" where it has none or one that is not a tag (so the dump's job is unknown)."""
    return value if isinstance(value, str) and JOB_TAG.fullmatch(value) else ""


class Header:
    """What a summary takes from a dump besides its entries (header, pg_config, pg_status), and the
    steps both readers of entries (rows here, columns in columnar.py) share."""

    def __init__(self, d: dict[str, Any], path: str, rank_hint: int | None, n_entries: int,
                 entries_ok: bool = True) -> None:
        version = str(d.get("version", ""))
        if version.split(".")[0] not in ("2", "3"):
            raise DumpError(f"unsupported dump version {version[:40]!r} (expected 2.x or 3.x)")
        fmt = "frnccl" if d.get("format") == schema.FORMAT_NAME else "torch"
        rank = d.get("rank")
        if type(rank) is not int:
            rank = rank_hint
        if rank is None or rank < 0:
            raise DumpError("cannot tell the rank (no 'rank' key and no digits at the end of the file name)")
        if rank >= MAX_RANKS:
            raise DumpError(f"implausible rank {str(rank)[:24]} (more than {MAX_RANKS} ranks)")
        if not entries_ok:
            raise DumpError("'entries' is not a list")
        pg_config = d.get("pg_config") or {}
        pg_status = d.get("pg_status") or {}
        if not isinstance(pg_config, dict) or not isinstance(pg_status, dict):
            raise DumpError("'pg_config' or 'pg_status' is not a dict")
        clock = d.get("clock")
        # Older dumps carry clock.store_offset_ns (always written as 0; the key is gone): honoured when set.
        offset = as_i64(clock.get("store_offset_ns", 0)) if isinstance(clock, dict) else 0
        boot = kernel_boot_ns(clock)
        stacks = d.get("thread_stacks", "")
        ws, pid, trig, bs = d.get("world_size"), d.get("pid"), d.get("trigger_rank"), d.get("buffer_size")
        s = RankSummary(
            rank=rank, path=path, fmt=fmt, version=version,
            world_size=ws if type(ws) is int and 0 < ws <= MAX_RANKS else None,
            hostname=str(d.get("hostname", "")), pid=pid if type(pid) is int else None,
            job_tag=job_tag(d.get("job_tag")),
            incident_id=str(d.get("incident_id", "")), dump_reason=str(d.get("dump_reason", "")),
            dump_detail=str(d.get("dump_detail", "")), trigger_rank=trig if type(trig) is int else None,
            dump_time_ns=as_ns(d.get("dump_time_ns"), offset),  # on the entries' clock
            thread_stacks=stacks if isinstance(stacks, str) else "",
            n_entries=n_entries, buffer_size=bs if type(bs) is int else None, boot_ns=boot,
        )
        s.exit = exit_info(d.get("exit"))
        self.s, self.fmt, self.offset, self.pg_status = s, fmt, offset, pg_status

        # process groups: keyed by name; a gloo pg may have an empty name, then the dict key is used
        pgs: dict[str, RankPg] = {}
        by_desc: dict[str, str] = {}
        anon: dict[str, Any] | None = None
        for key, cfg in pg_config.items():
            if not isinstance(cfg, dict):
                continue
            name = str(cfg.get("name") or key)
            if not name:  # torch's gloo registers every group under '': the last one created overwrote the others
                anon = cfg
                continue
            desc = str(cfg.get("desc", ""))
            pgs[name] = RankPg(name=name, desc=desc, ranks=_pg_ranks(cfg), sigs=s.sigs,
                               timeout_ms=_timeout_ms(cfg.get("timeout_ms")))
            if str(key) != name:
                by_desc.setdefault(str(key), name)
            if desc:
                by_desc.setdefault(desc, name)
            if desc == "default_pg":
                s.default_pg_size = len(pgs[name].ranks)
        self.pgs, self.by_desc, self.anon = pgs, by_desc, anon

    def pg_for(self, pg_name: str, pg_desc: str) -> RankPg:
        pgs = self.pgs
        rp = pgs.get(pg_name)
        if rp is None:
            alias = self.by_desc.get(pg_name) or self.by_desc.get(pg_desc)
            rp = pgs.get(alias) if alias else None
        if rp is None:
            rp = pgs[pg_name] = RankPg(name=pg_name, desc=pg_desc, ranks=(), sigs=self.s.sigs)
        return rp

    def status(self, pg_id_to_name: dict[str, str]) -> set[str]:
        """Apply pg_status (after the entries named their groups); the names of the groups that have one."""
        s, pgs, pg_status = self.s, self.pgs, self.pg_status
        if self.anon is not None:
            _adopt_anonymous_config(s, pgs, self.anon, pg_status)
        for rp in pgs.values():
            if not rp.ranks and rp.desc == "default_pg":
                rp.world_members = True

        # status: frnccl names the group; torch keys it by the process-local id that the entries carry as pg_id
        with_status: set[str] = set()
        for key, name in _status_names(s, pg_status, pg_id_to_name, pgs).items():
            st = pg_status[key]
            rp = self.pg_for(str(name), "")
            with_status.add(rp.name)
            rp.last_enqueued_coll = as_int(st.get("last_enqueued_collective", 0))
            rp.last_completed_coll = as_int(st.get("last_completed_collective", 0))
            rp.last_enqueued_p2p = as_int(st.get("last_enqueued_p2p", 0))
            rp.dropped_coll = as_int(st.get("last_dropped_collective"), -1) if "last_dropped_collective" in st else -2
            rp.dropped_p2p = as_int(st.get("last_dropped_p2p"), -1) if "last_dropped_p2p" in st else -2  # -2: infer
        return with_status

    def finish(self, newest: list[dict[str, Any]], last_rp: RankPg | None) -> None:
        """The last op and the callers of the newest entries (``newest``: the last FRAMES_KEPT entries as rows)."""
        s, pgs = self.s, self.pgs
        if newest:
            last = newest[-1]
            assert last_rp is not None
            lp = last.get("is_p2p")
            seq = as_int(last.get("p2p_seq_id") if lp else last.get("collective_seq_id"))
            state = state_code(last.get("state"))
            if last_rp.untrusted_states and not lp and (i := last_rp.slot(seq)) >= 0:
                state = last_rp.c_state[i]  # as corrected from pg_status
            # entries share their frames list when they were called from the same place (a compact dump's table)
            known: dict[int, tuple[Any, str]] = {}

            def frame(e: dict[str, Any]) -> str:
                fr = e.get("frames")
                got = known.get(id(fr))
                if got is None or got[0] is not fr:
                    got = known[id(fr)] = (fr, _frame(e))
                return got[1]

            s.last_op = LastOp(pg=last_rp.name, name=str(last["profiling_name"]), seq=seq, state=state,
                               record_id=as_int(last.get("record_id")), frame=frame(last),
                               thread_id=as_int(last.get("thread_id")))
            for e in newest:
                if not e.get("is_p2p") and (f := frame(e)):
                    pg = e["process_group"]
                    name = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(pg)
                    s.frames[(name if name in pgs else self.by_desc.get(name, name),
                              as_int(e.get("collective_seq_id")))] = f
        s.pgs = pgs
        for rp in pgs.values():
            _share_equal_columns(rp)


def mark_failed(s: RankSummary, rp: RankPg, cols: list[Sequence[Any]], fmt: str, has_status: bool) -> None:
    """Ops retired without completing (frnccl: failed), or torch's gloo's states that are never updated."""
    retired, states = cols[8], cols[2]
    if True in retired and states.count("completed") != len(states):
        if fmt == "frnccl":  # frnccl keeps states: retired and not completed is an op that failed
            # (the few such entries picked out in C first: a dump's last op is often still running)
            cand = compress(cols[1], map(and_, map(is_, retired, repeat(True)), map(ne, states, repeat("completed"))))
            rp.failed.update(as_int(q) for q in cand if as_int(q) > rp.dropped_coll)
        elif any(map(and_, map(is_, retired, repeat(True)), map(eq, states, repeat("scheduled")))):
            untrusted_states(s, rp, has_status)


def untrusted_states(s: RankSummary, rp: RankPg, has_status: bool) -> None:
    """Entries retired (finished) but still 'scheduled': torch's gloo never updates the state. Ops at or
    below pg_status last_completed_collective are taken as completed; started vs scheduled is unknown."""
    rp.untrusted_states = True
    if has_status and rp.last_completed_coll > 0 and len(rp.c_seq):
        last = rp.last_completed_coll
        rp.c_state = bytes(COMPLETED if q <= last else x for q, x in zip(rp.c_seq, rp.c_state))
        s.notes.append("entries say 'scheduled' although retired (torch's gloo does not update the state): "
                       "ops up to pg_status last_completed_collective are taken as completed, the others' "
                       "state is unknown")
    else:
        s.notes.append(f"entries of pg {_shown(rp.name)} say 'scheduled' although retired (torch's gloo does not "
                       "update the state), and no pg_status says which completed: their state is unknown")


def _share_equal_columns(rp: RankPg) -> None:
    """Columns with equal values become one object (GPU start = discovered start, or end = completion, as
    often): a rank's summary is a third smaller in memory and in the pickle from a loader worker. Nothing
    writes to the columns after reduction."""
    for a in ("c_arrive", "c_end"):
        col = getattr(rp, a)
        for b in ("c_started", "c_completed", "c_created"):
            other = getattr(rp, b)
            if col is not other and col == other:
                setattr(rp, a, other)
                break


def _adopt_anonymous_config(s: RankSummary, pgs: dict[str, RankPg], cfg: dict[str, Any],
                            pg_status: dict[Any, Any]) -> None:
    """torch's gloo writes pg_config {'': {'name': '', ...}}: every group registered under the empty
    name, the last one created winning. It describes a group only when the process has one group (one
    pg_status key, one group in the entries); else its members are not in the dump."""
    members = _pg_ranks(cfg)
    if members and len(pgs) == 1 and len(pg_status) <= 1:
        rp = next(iter(pgs.values()))
        if not rp.ranks:
            rp.ranks = members
            if rp.desc == "default_pg":
                s.default_pg_size = len(members)
            return


def _status_names(s: RankSummary, pg_status: dict[Any, Any], by_id: dict[str, str],
                  pgs: dict[str, RankPg]) -> dict[Any, str]:
    """pg_status key -> group name. frnccl writes the name in the status; torch keys it by the process-local
    id of the group (creation order in this process), which the entries carry as pg_id. A key no entry
    names (the group's ops all left the ring buffer) is matched to the one group left over, or, when
    the groups left over have torch's default names (a counter over the job's creation order), in order
    of creation; otherwise it is left out and a note says so, rather than guessing."""
    out: dict[Any, str] = {}
    rest: list[Any] = []
    for key, st in pg_status.items():
        if not isinstance(st, dict):
            continue
        name = st.get("process_group")
        if name:
            out[key] = str(name)
        elif str(key) in by_id:
            out[key] = by_id[str(key)]
        else:
            rest.append(key)
    if not rest:
        return out
    left = [n for n in pgs if n not in set(out.values())]
    if len(rest) == 1 and len(left) == 1:
        out[rest[0]] = left[0]
        return out
    keys = [str(k) for k in rest]
    if (len(rest) == len(left) and all(k.isdigit() for k in keys) and all(n.isdigit() for n in left)
            and all(str(k).isdigit() and v.isdigit() for k, v in out.items())):
        pairs = list(zip(sorted(rest, key=lambda k: int(k)), sorted(left, key=int)))
        order = sorted([(int(k), int(v)) for k, v in out.items()] + [(int(k), int(v)) for k, v in pairs])
        if all(a[1] < b[1] for a, b in pairwise(order)):  # ids and names grow together: creation order
            out.update(pairs)
            return out
    s.notes.append(f"pg_status keys {', '.join(_shown(k) for k in keys[:8])} could not be matched to a group "
                   "(torch keys them by a process-local id that no entry names): their counters are not used")
    return out


def _shown(k: Any) -> str:
    t = str(k)
    return repr(t if len(t) <= 20 else t[:20] + "...")


MAX_TIMEOUT_MS = 365 * 24 * 3600 * 1000  # a year: beyond it, a value is not a timeout anyone set


def _timeout_ms(v: Any) -> int:
    """A group's timeout in ms from pg_config; 0 (unknown) for anything but a plausible positive integer."""
    t = as_int(v, 0)
    return t if 0 < t <= MAX_TIMEOUT_MS else 0


def _pg_ranks(cfg: dict[str, Any]) -> tuple[int, ...]:
    """The PG's members as global ranks, ascending (raises DumpError for implausible ones)."""
    rs = _members(cfg)
    if rs and (rs[0] < 0 or rs[-1] >= MAX_RANKS):
        raise DumpError(f"implausible rank in pg_config ({str(rs[0] if rs[0] < 0 else rs[-1])[:24]})")
    return rs


def _members(cfg: dict[str, Any]) -> tuple[int, ...]:
    text = cfg.get("members")
    if type(text) is str:
        return _members_text(text)
    gr = cfg.get("global_ranks")
    if isinstance(gr, (list, tuple)):
        return _sorted_ints(gr)
    rs = cfg.get("ranks")
    if isinstance(rs, str):  # torch writes str(list): "[0, 1, 2]"
        if len(rs) > 1 << 24:
            raise DumpError("pg_config ranks too long")
        try:
            val = json.loads(rs)
        except ValueError:
            try:
                val = ast.literal_eval(rs)
            except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
                return ()
        except RecursionError:
            return ()
        if isinstance(val, (list, tuple, set)):
            return _sorted_ints(val)
        return ()
    if isinstance(rs, (list, tuple)):
        return _sorted_ints(rs)
    return ()


def _sorted_ints(vals: Any) -> tuple[int, ...]:
    # Every dump of a job lists the default group's members, world_size of them: converted once per process
    # (a hit is a hash and a compare in C; equal lists convert alike, 1.0 == 1 included; the list columnar.py
    # shares between dumps is the same object).
    if vals is _MEMBERS_LAST[0]:
        return _MEMBERS_LAST[1]
    try:
        key: tuple[Any, ...] | None = tuple(vals) if len(vals) >= _MEMBERS_MIN else None
        got = _MEMBERS.get(key) if key is not None else None
    except TypeError:  # not a sized iterable of hashable values: converted (and refused) below
        key = got = None
    if got is not None:
        return got
    try:
        out = tuple(sorted(map(int, vals)))
    except (TypeError, ValueError, OverflowError):
        raise DumpError("pg_config: member ranks are not integers") from None
    if key is not None:
        if len(_MEMBERS) >= _MEMBERS_MAX:
            _MEMBERS.clear()
        _MEMBERS[key] = out
    return out


def _members_text(text: str) -> tuple[int, ...]:
    # The same few texts ("0:100000", "5:100005:8") are in thousands of dumps: each is decoded once per
    # process and every dump holding it gets the same tuple (model.py sends it to the analyzer as a range,
    # load.py and match.py share it by identity), so a dump costs the length of its text, not the world size.
    global _MEMBERS_HELD
    got = _MEMBERS_BY_TEXT.get(text)
    if got is not None:
        return got
    try:
        out = tuple(sorted(members.decode(text, MAX_RANKS)))
    except members.MembersError as exc:
        raise DumpError(f"pg_config members: {exc}") from None
    if len(out) < _MEMBERS_MIN:  # a TP block: as cheap to decode again as to look up, and thousands of them
        return out
    if len(_MEMBERS_BY_TEXT) >= _MEMBERS_TEXTS_MAX or _MEMBERS_HELD + len(out) > _MEMBERS_HELD_MAX:
        _MEMBERS_BY_TEXT.clear()  # hostile files with a new long text each: memory stays bounded
        _MEMBERS_HELD = 0
    _MEMBERS_BY_TEXT[text] = out
    _MEMBERS_HELD += len(out)
    return out


def share_members(vals: list[Any]) -> None:
    """columnar.py puts this one list object in every dump that holds its text: its conversion is kept by
    identity (the list is held here, so its id is not reused; nothing writes to it)."""
    _MEMBERS_LAST[:] = [None, ()]
    _MEMBERS_LAST[:] = [vals, _sorted_ints(vals)]


_MEMBERS: dict[tuple[Any, ...], tuple[int, ...]] = {}
_MEMBERS_MIN, _MEMBERS_MAX = 64, 64
_MEMBERS_BY_TEXT: dict[str, tuple[int, ...]] = {}
_MEMBERS_TEXTS_MAX = 4096  # long texts: a TP x DP job has 1 + TP of them
_MEMBERS_HELD_MAX = 4 * MAX_RANKS  # ranks held in _MEMBERS_BY_TEXT's tuples, all together
_MEMBERS_HELD = 0
_MEMBERS_LAST: list[Any] = [None, ()]


# A frame of torch's own code that issues collectives (distributed_c10d.all_reduce and its logging decorators,
# DDP, FSDP), in an installed torch or a source checkout.
_TORCH_FILE = re.compile(r"(^|[/\\])torch[/\\](distributed|nn[/\\]parallel)[/\\]")


def _frame(e: dict[str, Any]) -> str:
    """Where the op was called from: the innermost frame outside torch's own wrappers, else the innermost."""
    frames = [f for f in e.get("frames") or () if isinstance(f, dict)] if isinstance(e.get("frames"), list) else []
    if not frames:
        return ""
    f = next((f for f in frames if not _TORCH_FILE.search(str(f.get("filename", "")))), frames[0])
    return f"{f.get('name', '?')} ({f.get('filename', '?')}:{f.get('line', '?')})"
