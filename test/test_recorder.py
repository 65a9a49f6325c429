"""The recorder and its dumps, checked against known sequences of ops in real multi-process CPU jobs.

Jobs (each a real TCPStore job with a hard time bound, see dist_harness.py):
  recorder_dump.py     3 ranks: every collective kind, p2p on the world group and on
                       new_group([1, 2]), one op left unfinished, a job-wide dump in all
                       three formats, plus fr_backend.trace_entries() in-process
  recorder_healthy.py  2 ranks, FRNCCL_STACKS=none, default formats: a healthy job torch's
                       fr_trace must accept (through `frnccl export --torch`); repeated dumps
                       must not overwrite each other
  recorder_ring.py     2 ranks: FRNCCL_BUFFER_SIZE=8 wrap-around, FRNCCL_BUFFER_SIZE=0
  recorder_config.py   1 process: bad FRNCCL_* values refused by init_process_group
  stack_capture.py     2 ranks: recorded caller stacks against traceback.extract_stack(), both
                       capture paths (GIL-free frame walk, public frame API)
The test side reads every file the jobs write; the workers only report what cannot be
seen from outside (pids, clock readings around the ops and the dumps).
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from dist_harness import TEST_DIR, Job, plain, run_ranks
from fr_backend import config as frconfig
from fr_backend import members
from fr_backend import schema
from fr_backend.analyzer.load import load_dump
from fr_backend.config import stacks_signal

ROOT = TEST_DIR.parent
JOB_TIMEOUT_S = 90
SLACK_NS = 50_000_000  # 50 ms: time.time_ns() and the recorder read the same CLOCK_REALTIME
FAST_DUMPS = {"FRNCCL_COORD_CHECK_MS": "50"}  # ranks look for job-wide dump requests every 50 ms


def ok_results(job: Job) -> list[dict[str, Any]]:
    job.assert_ok()
    return job.results()


def load_pickle(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        return pickle.load(f)


def incident_dirs(dump_dir: Path) -> list[Path]:
    return sorted(p for p in dump_dir.iterdir() if p.is_dir()) if dump_dir.exists() else []


def function_lines(path: str, name: str) -> range:
    tree = ast.parse(Path(path).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return range(node.lineno, node.end_lineno + 1)
    raise AssertionError(f"{name} not in {path}")


# --------------------------------------------------------------------------------------------
# the 3-rank job with every collective kind, p2p in a subgroup and a job-wide dump
# --------------------------------------------------------------------------------------------

JOB_ID = "frjob-42"
ATTEMPT = 2


@pytest.fixture(scope="module")
def dump_job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recorder_dump")
    dump_dir, out_dir = tmp / "dumps", tmp / "out"
    out_dir.mkdir()
    env = {"FRNCCL_DUMP_DIR": str(dump_dir), "REC_OUT_DIR": str(out_dir), "FRNCCL_JOB_ID": JOB_ID,
           "TORCHELASTIC_RESTART_COUNT": str(ATTEMPT), "FRNCCL_DUMP_FORMATS": "compact,pickle,json,chrome",
           "FRNCCL_STACKS": "python", **FAST_DUMPS}
    job = run_ranks("recorder_dump.py", 3, timeout=JOB_TIMEOUT_S, env=env)
    results = ok_results(job)
    incidents = incident_dirs(dump_dir)
    assert len(incidents) == 1, f"one job-wide incident expected, found {incidents}\n{job.describe()}"
    inc = incidents[0]
    dumps = {r: load_pickle(inc / "pickle" / f"frnccl_rank_{r}") for r in range(3)}
    return {"job": job, "results": results, "dump_dir": dump_dir, "incident": inc, "dumps": dumps, "out_dir": out_dir}


def expected_entries(rank: int) -> list[dict[str, Any]]:
    """What rank `rank` recorded, oldest first: (group, profiling name, seqs, peer, sizes, dtypes)."""
    def coll(g, name, seq, ins, idt, outs, odt):
        return dict(g=g, profiling_name=name, collective_seq_id=seq, p2p_seq_id=0, is_p2p=False, peer=-1,
                    input_sizes=ins, input_dtypes=idt, output_sizes=outs, output_dtypes=odt)

    def p2p(g, name, seq, peer, shape, dt):
        return dict(g=g, profiling_name=name, collective_seq_id=0, p2p_seq_id=seq, is_p2p=True, peer=peer,
                    input_sizes=[shape], input_dtypes=[dt], output_sizes=[shape], output_dtypes=[dt])

    out = [
        coll("W", "gloo:all_reduce", 1, [[4, 3]], ["Float"], [[4, 3]], ["Float"]),
        coll("W", "gloo:all_gather", 2, [[5]], ["Long"], [[5]] * 3, ["Long"] * 3),
        coll("W", "gloo:_all_gather_base", 3, [[2, 2]], ["BFloat16"], [[6, 2]], ["BFloat16"]),
        coll("W", "gloo:_reduce_scatter_base", 4, [[9]], ["Double"], [[3]], ["Double"]),
        coll("W", "gloo:all_to_all_single", 5, [[6]], ["Float"], [[6]], ["Float"]),
        coll("W", "gloo:broadcast", 6, [[7]], ["Int"], [[7]], ["Int"]),
    ]
    if rank == 0:
        out.append(p2p("W", "gloo:send 0->1", 1, 1, [4], "Float"))
    if rank == 1:
        out += [
            p2p("W", "gloo:recv 1<-0", 1, 0, [4], "Float"),
            coll("S", "gloo:all_reduce", 1, [[2]], ["Float"], [[2]], ["Float"]),
            # SUB = new_group([1, 2]): group-local ranks in the name, global rank as peer
            p2p("S", "gloo:send 0->1", 1, 2, [3], "Half"),
            p2p("S", "gloo:recv 0<-1", 2, 2, [3], "Half"),
        ]
    if rank == 2:
        out += [
            coll("S", "gloo:all_reduce", 1, [[2]], ["Float"], [[2]], ["Float"]),
            p2p("S", "gloo:recv 1<-0", 1, 1, [3], "Half"),
            p2p("S", "gloo:send 1->0", 2, 1, [3], "Half"),
            p2p("S", "gloo:recv 1<-0", 3, 1, [5], "Float"),  # still waiting at dump time
        ]
    return out


def group_name(result: dict, g: str) -> str:
    return result["world_group"] if g == "W" else result["sub_group"]


def test_dump_has_every_schema_key(dump_job):
    """Each scope of dump_keys.def appears exactly (duration_ms may be absent: 'absent when unknown')."""
    top = set(schema.keys_in("top")) | set(schema.keys_in("header"))
    for rank, d in dump_job["dumps"].items():
        assert set(d) == top, f"rank {rank}: missing {top - set(d)}, extra {set(d) - top}"
        assert set(d["clock"]) == set(schema.keys_in("clock")), d["clock"]
        assert set(d["watchdog"]) == set(schema.keys_in("watchdog")), d["watchdog"]
        for name, c in d["pg_config"].items():  # global_ranks: older dumps only
            assert set(c) == set(schema.keys_in("pg_config")) - {"global_ranks"}, (name, c)
        for pg_id, s in d["pg_status"].items():
            assert set(s) == set(schema.keys_in("pg_status")), (pg_id, s)
        want = set(schema.keys_in("entry"))
        for e in d["entries"]:
            keys = set(e)
            assert keys == want or keys == want - {"duration_ms"}, f"rank {rank}: {want ^ keys}"
            for f in e["frames"]:
                assert set(f) == set(schema.keys_in("frame")), f


def test_entries_match_known_sequence(dump_job):
    """Names, sizes, dtypes, collective/p2p seq ids, op ids, peers (global ranks), state."""
    for res in dump_job["results"]:
        rank = res["rank"]
        d = dump_job["dumps"][rank]
        entries, want = d["entries"], expected_entries(rank)
        got_names = [e["profiling_name"] for e in entries]
        assert got_names == [w["profiling_name"] for w in want], f"rank {rank}: {got_names}"
        for i, (e, w) in enumerate(zip(entries, want)):
            assert e["process_group"][0] == group_name(res, w["g"]), (rank, i, e["process_group"])
            for key, value in w.items():
                if key != "g":
                    assert e[key] == value, f"rank {rank} entry {i} ({e['profiling_name']}): {key} {e[key]!r} != {value!r}"
            pg = d["pg_config"][e["process_group"][0]]
            assert e["timeout_ms"] == pg["timeout_ms"], (rank, i, e["timeout_ms"], pg)
            assert isinstance(e["thread_id"], str) and e["thread_id"].isdigit() and e["thread_name"], e
        assert [e["record_id"] for e in entries] == list(range(len(entries))), f"rank {rank}"
        # op_id counts every op of a group (collective or p2p), from 1
        for g in {e["process_group"][0] for e in entries}:
            ops = [e["op_id"] for e in entries if e["process_group"][0] == g]
            assert ops == list(range(1, len(ops) + 1)), f"rank {rank} pg {g}: op ids {ops}"
        pending = entries[-1] if rank == 2 else None
        for e in entries:
            if e is pending:
                assert e["state"] in ("scheduled", "started") and not e["retired"], e
            else:
                assert e["state"] == "completed" and e["retired"], f"rank {rank}: {e['profiling_name']} {e['state']}"
        if pending is not None:
            assert pending["time_discovered_completed_ns"] == 0 and "duration_ms" not in pending, pending


def test_pg_config_and_process_group(dump_job):
    for res in dump_job["results"]:
        rank, d = res["rank"], dump_job["dumps"][res["rank"]]
        world = d["pg_config"][res["world_group"]]
        # members once, as runs; the pickle (torch's fr_trace reads it as it is) adds torch's ranks string
        assert world == {"name": res["world_group"], "desc": "default_pg", "members": "0:3", "ranks": "[0, 1, 2]",
                         "backend": "gloo", "timeout_ms": 60000, "size": 3}, world
        if rank == 0:
            assert set(d["pg_config"]) == {res["world_group"]}, d["pg_config"]  # not a member of SUB
        else:
            sub = d["pg_config"][res["sub_group"]]
            assert (sub["name"], sub["members"], sub["ranks"], sub["size"], sub["backend"]) == (
                res["sub_group"], "1,2", "[1, 2]", 2, "gloo"), sub
        for name, c in d["pg_config"].items():
            got = members.decode(c["members"], 1 << 20)
            assert c["name"] == name and c["ranks"] == str(got) and c["size"] == len(got), c
            assert "global_ranks" not in c, c
        for e in d["entries"]:
            name = e["process_group"][0]
            assert list(e["process_group"]) == [name, d["pg_config"][name]["desc"]], e["process_group"]
            assert d["pg_status"][str(e["pg_id"])]["process_group"] == name, (e["pg_id"], d["pg_status"])


def test_pg_status_matches_ops(dump_job):
    for res in dump_job["results"]:
        rank, d = res["rank"], dump_job["dumps"][res["rank"]]
        by_name = {s["process_group"]: s for s in d["pg_status"].values()}
        p2p_w = 1 if rank in (0, 1) else 0
        assert by_name[res["world_group"]] == {
            "process_group": res["world_group"], "last_enqueued_collective": 6, "last_started_collective": 6,
            "last_completed_collective": 6, "last_enqueued_p2p": p2p_w, "last_started_p2p": p2p_w,
            "last_completed_p2p": p2p_w, "last_dropped_collective": -1, "last_dropped_p2p": -1}, by_name
        if rank == 0:
            continue
        sub = by_name[res["sub_group"]]
        enq, done = (2, 2) if rank == 1 else (3, 2)
        started = enq if rank == 1 or d["entries"][-1]["state"] == "started" else done
        assert sub == {
            "process_group": res["sub_group"], "last_enqueued_collective": 1, "last_started_collective": 1,
            "last_completed_collective": 1, "last_enqueued_p2p": enq, "last_started_p2p": started,
            "last_completed_p2p": done, "last_dropped_collective": -1, "last_dropped_p2p": -1}, sub


def test_header_describes_the_writer(dump_job):
    incident = dump_job["incident"].name
    for res in dump_job["results"]:
        rank, d = res["rank"], dump_job["dumps"][res["rank"]]
        assert (d["format"], d["version"]) == (schema.FORMAT_NAME, schema.FORMAT_VERSION)
        assert (d["rank"], d["local_rank"], d["world_size"]) == (rank, rank, 3)
        assert d["hostname"] == socket.gethostname()
        assert d["pid"] == res["pid"]
        assert (d["job_id"], d["attempt"]) == (JOB_ID, ATTEMPT)
        assert d["torch_version"] == torch.__version__
        assert d["nccl_version"] == res["nccl_version_expected"]
        assert d["comm_lib_version"] == ""  # a CPU-only job, whatever the build
        assert isinstance(d["frnccl_version"], str) and d["frnccl_version"]
        assert d["incident_id"] == incident
        assert (d["dump_reason"], d["trigger_rank"]) == ("signal", 0)
        assert "signal" in d["dump_detail"]
        assert res["t_dump_start"] - SLACK_NS <= d["dump_time_ns"] <= res["t_dump_seen"] + SLACK_NS, (d["dump_time_ns"], res)
        clock = d["clock"]
        assert clock["source"] == "CLOCK_REALTIME"
        assert abs(clock["realtime_ns"] - d["dump_time_ns"]) < 1_000_000_000, clock
        assert 0 < clock["monotonic_ns"] < clock["realtime_ns"] and "store_offset_ns" not in clock, clock
        assert d["buffer_size"] == 20000 and d["stacks_symbolized"] is True
        # The walk covers CPython 3.11-3.13 (test_frame_walk.py checks the layouts); others use the public API.
        walked = sys.version_info[:2] in {(3, 11), (3, 12), (3, 13)}
        assert d["stack_capture"].startswith("interpreter frames" if walked else "public frame API"), d["stack_capture"]
        assert res["t_ops_start"] <= d["watchdog"]["last_heartbeat_ns"] <= d["dump_time_ns"] + SLACK_NS, d["watchdog"]
        assert "recorder_dump.py" in d["thread_stacks"], d["thread_stacks"][:500]


def test_timestamps_are_ns_and_ordered(dump_job):
    for res in dump_job["results"]:
        rank, d = res["rank"], dump_job["dumps"][res["rank"]]
        entries = d["entries"]
        for i, e in enumerate(entries):
            created = e["time_created_ns"]
            pending = rank == 2 and i == len(entries) - 1
            hi = res["t_dump_start"] if pending else res["t_ops_end"]
            assert res["t_ops_start"] - SLACK_NS <= created <= hi + SLACK_NS, (rank, i, created, res)
            if e["state"] == "completed":
                assert created <= e["time_discovered_started_ns"] <= e["time_discovered_completed_ns"] <= d["dump_time_ns"], e
                assert e["time_gpu_started_ns"] == 0 and e["time_gpu_completed_ns"] == 0, e
            elif e["state"] == "started":
                assert created <= e["time_discovered_started_ns"] <= d["dump_time_ns"] and e["time_discovered_completed_ns"] == 0, e
        threads: dict[str, list[int]] = {}
        for e in entries:
            threads.setdefault(e["thread_id"], []).append(e["time_created_ns"])
        for tid, times in threads.items():
            assert times == sorted(times), f"rank {rank} thread {tid}: created times go back {times}"


def test_json_and_pickle_agree(dump_job):
    inc = dump_job["incident"]
    for rank, d in dump_job["dumps"].items():
        with open(inc / "json" / f"frnccl_rank_{rank}.json") as f:
            from_json = json.load(f)
        assert all("ranks" not in c for c in from_json["pg_config"].values()), from_json["pg_config"]
        assert plain(without_torch_ranks(d)) == from_json, f"rank {rank}: pickle and JSON differ"


def test_compact_and_pickle_agree(dump_job):
    """Every collective kind, p2p in a subgroup, an unfinished op: the compact file's columns give back
    the pickle's entries, through the reader the analyzer uses."""
    inc = dump_job["incident"]
    for rank in dump_job["dumps"]:
        compact = load_dump(str(inc / "compact" / f"frnccl_rank_{rank}.json.gz"))
        pickled = load_dump(str(inc / "pickle" / f"frnccl_rank_{rank}"))
        assert compact["entries"] and plain(compact) == plain(without_torch_ranks(pickled)), (
            f"rank {rank}: compact and pickle differ")


def without_torch_ranks(d: dict[str, Any]) -> dict[str, Any]:
    """The pickle's dict as the other formats hold it: without torch's ranks string (the pickle's alone)."""
    return dict(d, pg_config={k: {f: v for f, v in c.items() if f != "ranks"} for k, c in d["pg_config"].items()})


def test_chrome_trace_is_valid(dump_job):
    inc = dump_job["incident"]
    for res in dump_job["results"]:
        rank, d = res["rank"], dump_job["dumps"][res["rank"]]
        with open(inc / "chrome" / f"frnccl_rank_{rank}.trace.json") as f:
            trace = json.load(f)
        events = trace["traceEvents"]
        assert isinstance(events, list) and events
        for ev in events:
            assert isinstance(ev.get("ph"), str) and isinstance(ev.get("pid"), int) and isinstance(ev.get("tid"), int), ev
            # Metadata ('M') events carry no timestamp in the Trace Event Format spec's own
            # examples; every other event must have a numeric ts (microseconds).
            if ev["ph"] != "M":
                assert isinstance(ev.get("ts"), (int, float)) and not isinstance(ev["ts"], bool), ev
            else:
                assert "ts" not in ev or isinstance(ev["ts"], (int, float)), ev
            if ev["ph"] == "X":
                assert isinstance(ev.get("dur"), (int, float)) and ev["dur"] >= 0, ev
        meta = [ev for ev in events if ev["ph"] == "M"]
        procs = [ev for ev in meta if ev["name"] == "process_name"]
        assert len(procs) == 1 and procs[0]["pid"] == rank and f"rank {rank}" in procs[0]["args"]["name"], procs
        tracks = {ev["tid"]: ev["args"]["name"] for ev in meta if ev["name"] == "thread_name"}
        want_tracks = {int(pg_id): s["process_group"] for pg_id, s in d["pg_status"].items()}
        assert set(tracks) == set(want_tracks), (tracks, want_tracks)
        for tid, pg_name in want_tracks.items():
            assert pg_name in tracks[tid] and d["pg_config"][pg_name]["desc"] in tracks[tid], tracks
        ops = [ev for ev in events if ev["ph"] != "M"]
        assert [ev["name"] for ev in ops] == [e["profiling_name"] for e in d["entries"]]
        assert all(ev["pid"] == rank for ev in events)
        unfinished = [e for e in d["entries"] if e["state"] != "completed"]
        instants = [ev for ev in ops if ev["ph"] == "i"]
        assert len(instants) == len(unfinished) == (1 if rank == 2 else 0), (instants, unfinished)
        assert all(ev["ph"] == "X" for ev in ops if ev not in instants)
        for ev, e in zip(ops, d["entries"]):
            assert ev["tid"] == e["pg_id"] and ev["args"]["record_id"] == e["record_id"], (ev, e)
            start_ns = e["time_discovered_started_ns"] or e["time_created_ns"]
            assert abs(ev["ts"] * 1000 - start_ns) < 1000, (ev["ts"], start_ns)  # us, same instant


def test_files_layout_mode_and_no_partials(dump_job):
    inc, dump_dir = dump_job["incident"], dump_job["dump_dir"]
    for rank in range(3):
        for fmt in ("compact", "pickle", "json", "chrome"):
            path = inc / schema.rank_file_name(fmt, rank)
            assert path.is_file(), path
            mode = stat.S_IMODE(os.stat(path).st_mode)
            assert mode == 0o640, f"{path}: mode {oct(mode)}"
    assert sorted(p.name for p in inc.iterdir()) == ["chrome", "compact", "json", "pickle"]
    leftovers = [os.path.join(d, n) for d, _, names in os.walk(dump_dir) for n in names if ".partial" in n]
    assert not leftovers, leftovers


def test_python_frames_name_the_worker(dump_job):
    """FRNCCL_STACKS=python: frames innermost first, through torch, down to the worker's function and line."""
    res0 = dump_job["results"][0]
    worker = res0["worker_file"]
    lines = function_lines(worker, "issue_known_sequence")
    for res in dump_job["results"]:
        d = dump_job["dumps"][res["rank"]]
        for e in d["entries"]:
            frames = e["frames"]
            assert frames, e
            assert "torch" in frames[0]["filename"], frames[0]  # innermost: torch.distributed
            ours = [f for f in frames if f["filename"] == worker]
            assert ours, frames
            caller = ours[0]
            if e["p2p_seq_id"] == 3:  # the irecv issued at module level
                assert caller["name"] == "<module>", caller
            else:
                assert caller["name"] == "issue_known_sequence" and caller["line"] in lines, (caller, lines)
            assert all(isinstance(f["line"], int) and f["line"] > 0 for f in frames), frames


def test_trace_entries_in_process(dump_job):
    """fr_backend.trace_entries(): the dump schema, in-process, symbolized frames naming the worker function."""
    worker = dump_job["results"][0]["worker_file"]
    for res in dump_job["results"]:
        rank = res["rank"]
        with open(dump_job["out_dir"] / f"inproc_{rank}.pkl", "rb") as f:
            inproc = pickle.load(f)
        d = dump_job["dumps"][rank]
        top = set(schema.keys_in("top")) | set(schema.keys_in("header"))
        assert set(inproc) == top, top ^ set(inproc)
        assert inproc["incident_id"] == "inspect" and inproc["stacks_symbolized"] is True
        entry_keys = set(schema.keys_in("entry"))
        assert all(set(e) in (entry_keys, entry_keys - {"duration_ms"}) for e in inproc["entries"])
        # The same ops as the dump; afterwards rank 1 sent (p2p 3 on SUB) and rank 2's irecv finished.
        n = len(d["entries"]) + (1 if rank == 1 else 0)
        assert len(inproc["entries"]) == n, [e["profiling_name"] for e in inproc["entries"]]
        same = ("record_id", "profiling_name", "collective_seq_id", "p2p_seq_id", "op_id", "peer",
                "input_sizes", "output_sizes", "input_dtypes", "output_dtypes", "time_created_ns", "frames")
        for a, b in zip(d["entries"], inproc["entries"]):
            assert {k: plain(a[k]) for k in same} == {k: plain(b[k]) for k in same}, (a, b)
        named = [e for e in inproc["entries"]
                 if any(f["name"] == "issue_known_sequence" and f["filename"] == worker for f in e["frames"])]
        assert len(named) == len(expected_entries(rank)) - (1 if rank == 2 else 0), [e["frames"] for e in inproc["entries"]]
        assert plain(inproc["pg_config"]) == plain(without_torch_ranks(d)["pg_config"])  # ranks: the pickle file's alone


# --------------------------------------------------------------------------------------------
# a healthy 2-rank job, FRNCCL_STACKS=none: torch's fr_trace, repeated dumps
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def healthy_job(tmp_path_factory):
    dump_dir = tmp_path_factory.mktemp("recorder_healthy") / "dumps"
    env = {"FRNCCL_DUMP_DIR": str(dump_dir), "FRNCCL_STACKS": "none", **FAST_DUMPS}
    job = run_ranks("recorder_healthy.py", 2, timeout=JOB_TIMEOUT_S, env=env)
    return {"job": job, "results": ok_results(job), "dump_dir": dump_dir}


def test_stacks_none_gives_empty_frames(healthy_job):
    signal_dir = Path(healthy_job["results"][0]["signal_file"]).parents[1]
    assert sorted(p.name for p in signal_dir.iterdir()) == ["compact"]  # the default format only
    for rank in range(2):
        d = load_dump(str(signal_dir / "compact" / f"frnccl_rank_{rank}.json.gz"))
        assert d["entries"] and all(e["frames"] == [] for e in d["entries"]), [e["frames"] for e in d["entries"]]
        assert d["stacks_symbolized"] is False


def test_torch_fr_trace_reads_healthy_dump(healthy_job, tmp_path):
    """torch's own analyzer, on `frnccl export --torch` of a job-wide incident written in the default
    format: all ranks, every collective passes."""
    res = healthy_job["results"]
    signal_dir = Path(res[0]["signal_file"]).parents[1]
    assert Path(res[1]["signal_file"]).parents[1] == signal_dir, res  # one incident folder for the job
    n_entries = res[0]["signal_entries"]
    exported = tmp_path / "torch"
    proc = _frnccl_cli("export", "--torch", str(signal_dir), str(exported), env=_clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in exported.iterdir()) == ["frnccl_rank_0", "frnccl_rank_1"], proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(exported), "-v"],
        capture_output=True, text=True, timeout=120, cwd=str(ROOT),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "loaded 2 files" in out, out
    # -v prints the matched collectives: every entry of the job matched on both ranks
    assert out.count("pass_check=True") == n_entries, out[-3000:]
    assert "pass_check=False" not in out and "missing_ranks={" not in out, out[-3000:]
    assert "mismatch_collectives={" not in out and "type_of_mismatch=" in out, out[-3000:]
    assert "type_of_mismatch=None" in out and out.count("type_of_mismatch=None") == n_entries
    assert out.count("global_rank=0") >= n_entries and out.count("global_rank=1") >= n_entries
    for bad in ("Traceback", "Error", "not found", "Missing"):
        assert bad not in out, out[-3000:]


def test_dump_shows_ops_that_just_returned_as_completed(healthy_job):
    """Each dump follows the ops that returned just before it, without a pause for the watchdog: the
    dump asks the watchdog for a pass of its own."""
    res = healthy_job["results"]
    signal_dir = Path(res[0]["signal_file"]).parents[1]
    for r in res:
        signal_states = [e["state"] for e in
                         load_dump(str(signal_dir / "compact" / f"frnccl_rank_{r['rank']}.json.gz"))["entries"]]
        assert signal_states and set(signal_states) == {"completed"}, (r["rank"], signal_states)
        assert len(r["second_states"]) == r["manual_entries"][1], r
        assert set(r["second_states"]) == {"completed"}, (r["rank"], r["second_states"])


def test_earlier_incident_is_kept(healthy_job):
    """A later dump (another incident) leaves the earlier incident's folder as it was."""
    res = healthy_job["results"]
    signal_dir = Path(res[0]["signal_file"]).parents[1]
    for r in res:
        assert Path(r["manual_dirs"][0]) != signal_dir
        assert len(load_dump(str(signal_dir / "compact" / f"frnccl_rank_{r['rank']}.json.gz"))["entries"]) == \
            r["signal_entries"]
    leftovers = [n for _, _, names in os.walk(healthy_job["dump_dir"]) for n in names if ".partial" in n]
    assert not leftovers, leftovers


def test_two_dumps_two_folders(healthy_job):
    for r in healthy_job["results"]:
        if not r["dumps_within_one_second"]:
            pytest.skip("the machine was too slow to fit both dumps into one wall-clock second")
        first, second = r["manual_dirs"]
        assert first != second, f"rank {r['rank']}: both dumps went to {first}"
        assert r["first_manual_entries_after_second"] == r["first_manual_entries_then"], r


# --------------------------------------------------------------------------------------------
# ring buffer: FRNCCL_BUFFER_SIZE=8 and 0
# --------------------------------------------------------------------------------------------


def test_ring_buffer_wraps(tmp_path):
    cap = 8
    job = run_ranks("recorder_ring.py", 2, "wrap", timeout=JOB_TIMEOUT_S,
                    env={"FRNCCL_DUMP_DIR": str(tmp_path / "dumps"), "FRNCCL_BUFFER_SIZE": str(cap)})
    for res in ok_results(job):
        issued = [tuple(x) for x in res["issued"]]
        assert len(issued) > cap
        kept, evicted = issued[-cap:], issued[:-cap]
        entries = res["entries"]
        assert res["buffer_size"] == cap and len(entries) == cap, entries
        assert [e["record_id"] for e in entries] == list(range(len(issued) - cap, len(issued))), entries
        name_of = res["names"]
        got = [(e["process_group"][0], "p2p" if e["is_p2p"] else "coll",
                e["p2p_seq_id"] if e["is_p2p"] else e["collective_seq_id"]) for e in entries]
        assert got == [(name_of[g], kind, seq) for g, kind, seq in kept], got
        status = {s["process_group"]: s for s in res["pg_status"]}
        for g, name in name_of.items():
            s = status[name]
            for kind, key in (("coll", "collective"), ("p2p", "p2p")):
                dropped = [seq for gg, k, seq in evicted if gg == g and k == kind]
                all_seqs = [seq for gg, k, seq in issued if gg == g and k == kind]
                assert s[f"last_dropped_{key}"] == (max(dropped) if dropped else -1), (g, s, evicted)
                assert s[f"last_enqueued_{key}"] == (max(all_seqs) if all_seqs else 0), (g, s)
                assert s[f"last_completed_{key}"] == s[f"last_enqueued_{key}"], (g, s)
        # the layout guarantees each case is exercised: A lost collectives and p2p, B a collective, C nothing
        assert (status[name_of["A"]]["last_dropped_p2p"], status[name_of["B"]]["last_dropped_p2p"]) == (1, -1)
        assert (status[name_of["C"]]["last_dropped_collective"], status[name_of["C"]]["last_dropped_p2p"]) == (-1, -1)


def test_buffer_size_zero_records_nothing(tmp_path):
    job = run_ranks("recorder_ring.py", 2, "off", timeout=JOB_TIMEOUT_S,
                    env={"FRNCCL_DUMP_DIR": str(tmp_path / "dumps"), "FRNCCL_BUFFER_SIZE": "0"})
    for res in ok_results(job):
        assert res["ops_ok"], res
        assert (res["inproc_entries"], res["inproc_buffer_size"], res["dump_entries"], res["dump_buffer_size"]) == (0, 0, 0, 0), res
        assert res["dump_pg_names"] == res["pg_names"], res  # groups are still described


# --------------------------------------------------------------------------------------------
# configuration
# --------------------------------------------------------------------------------------------

BAD_VALUES = [
    ("FRNCCL_BUFFER_SIZE", "abc"),
    ("FRNCCL_STACKS", "foo"),
    ("FRNCCL_DUMP_FORMATS", "xml"),
    ("FRNCCL_DUMP_SIGNAL", "SIGKILL"),
    ("FRNCCL_ON_TIMEOUT", "maybe"),
    ("FRNCCL_BUFFER_SIZE", "-1"),
    ("FRNCCL_GPU_TIMING", "sometimes"),
    ("FRNCCL_DUMP_TIMEOUT_SEC", "0"),
]


@pytest.fixture(scope="module")
def config_job(tmp_path_factory):
    dump_dir = tmp_path_factory.mktemp("recorder_config") / "dumps"
    job = run_ranks("recorder_config.py", 1, *[f"{n}={v}" for n, v in BAD_VALUES], timeout=JOB_TIMEOUT_S,
                    env={"FRNCCL_DUMP_DIR": str(dump_dir)})
    return ok_results(job)[0]


@pytest.mark.parametrize("name,value", BAD_VALUES, ids=[f"{n}={v}" for n, v in BAD_VALUES])
def test_bad_value_stops_init_process_group(config_job, name, value):
    case = config_job["cases"][f"{name}={value}"]
    assert case["raised"], f"init_process_group accepted {name}={value}"
    assert case["type"] == "ConfigError", case
    assert name in case["message"] and "\n" not in case["message"].strip(), case["message"]


def test_good_config_works_after_refusals(config_job):
    assert config_job["good_after"] is True


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRNCCL_")}
    env.update(extra)
    return env


def _frnccl_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fr_backend.cli", *args], capture_output=True, text=True,
                          timeout=60, env=env, cwd=str(ROOT))


def test_frnccl_config_cli():
    bad = {"FRNCCL_BUFFER_SIZE": "abc", "FRNCCL_STACKS": "foo", "FRNCCL_DUMP_FORMATS": "xml",
           "FRNCCL_DUMP_SIGNAL": "SIGKILL", "FRNCCL_ON_TIMEOUT": "maybe"}
    proc = _frnccl_cli("config", env=_clean_env(**bad))
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    problems = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(problems) == len(bad), proc.stderr  # one line per bad variable
    for name in bad:
        assert sum(name in ln for ln in problems) == 1, (name, proc.stderr)
    for name, value in bad.items():
        assert f"{name}={value}" in proc.stdout, proc.stdout
    good = _frnccl_cli("config", env=_clean_env(FRNCCL_BUFFER_SIZE="64", FRNCCL_DUMP_FORMATS="json,chrome"))
    assert good.returncode == 0 and good.stderr == "", (good.stdout, good.stderr)
    assert "FRNCCL_BUFFER_SIZE=64" in good.stdout


# FrConfig.from_env unit tests: (variable, value, attribute, expected value or ConfigError)
E = frconfig.ConfigError
CONFIG_CASES = [
    ("FRNCCL_BUFFER_SIZE", "", "buffer_size", 20000),
    ("FRNCCL_BUFFER_SIZE", "  ", "buffer_size", 20000),
    ("FRNCCL_BUFFER_SIZE", " 16 ", "buffer_size", 16),
    ("FRNCCL_BUFFER_SIZE", "0", "buffer_size", 0),
    ("FRNCCL_BUFFER_SIZE", "-1", "buffer_size", E),
    ("FRNCCL_BUFFER_SIZE", "1e3", "buffer_size", E),
    ("FRNCCL_BUFFER_SIZE", "0x10", "buffer_size", E),
    ("FRNCCL_BUFFER_SIZE", "abc", "buffer_size", E),
    ("FRNCCL_STACKS", "", "stacks", "python"),
    ("FRNCCL_STACKS", "NONE", "stacks", "none"),
    ("FRNCCL_STACKS", " cpp ", "stacks", "cpp"),
    ("FRNCCL_STACKS", "foo", "stacks", E),
    ("FRNCCL_DUMP_FORMATS", "", "formats", ("compact",)),
    ("FRNCCL_DUMP_FORMATS", "compact,pickle", "formats", ("compact", "pickle")),
    ("FRNCCL_DUMP_FORMATS", "Chrome", "formats", ("chrome",)),
    ("FRNCCL_DUMP_FORMATS", "pickle, json ,chrome", "formats", ("pickle", "json", "chrome")),
    ("FRNCCL_DUMP_FORMATS", "pickle,,json", "formats", ("pickle", "json")),
    ("FRNCCL_DUMP_FORMATS", ",", "formats", E),
    ("FRNCCL_DUMP_FORMATS", "xml", "formats", E),
    ("FRNCCL_DUMP_FORMATS", "json,xml", "formats", E),
    ("FRNCCL_DUMP_TIMEOUT_SEC", "5", "dump_timeout_ms", 5000),
    ("FRNCCL_DUMP_TIMEOUT_SEC", "0", "dump_timeout_ms", E),
    ("FRNCCL_DUMP_TIMEOUT_SEC", "1.5", "dump_timeout_ms", E),
    ("FRNCCL_COORD_CHECK_MS", "10", "coord_check_ms", 10),
    ("FRNCCL_COORD_CHECK_MS", "9", "coord_check_ms", E),
    ("FRNCCL_HEARTBEAT_TIMEOUT_SEC", "0", "heartbeat_timeout_ms", 0),
    ("FRNCCL_HEARTBEAT_TIMEOUT_SEC", "3", "heartbeat_timeout_ms", 3000),
    ("FRNCCL_HEARTBEAT_TIMEOUT_SEC", "-3", "heartbeat_timeout_ms", E),
    ("FRNCCL_WATCHDOG_POLL_MS", "1", "watchdog_poll_ms", 1),
    ("FRNCCL_WATCHDOG_POLL_MS", "0", "watchdog_poll_ms", E),
    ("FRNCCL_SYMBOLIZE_TIMEOUT_MS", "0", "symbolize_timeout_ms", 0),
    ("FRNCCL_SYMBOLIZE_TIMEOUT_MS", "-5", "symbolize_timeout_ms", E),
    ("FRNCCL_ON_TIMEOUT", "", "on_timeout", "raise"),
    ("FRNCCL_ON_TIMEOUT", "EXIT", "on_timeout", "exit"),
    ("FRNCCL_ON_TIMEOUT", "maybe", "on_timeout", E),
    ("FRNCCL_DUMP_SIGNAL", "", "dump_signal", int(signal.SIGUSR1)),
    ("FRNCCL_DUMP_SIGNAL", "SIGUSR2", "dump_signal", int(signal.SIGUSR2)),
    ("FRNCCL_DUMP_SIGNAL", "usr2", "dump_signal", int(signal.SIGUSR2)),
    ("FRNCCL_DUMP_SIGNAL", "sigusr1", "dump_signal", int(signal.SIGUSR1)),
    ("FRNCCL_DUMP_SIGNAL", str(int(signal.SIGUSR2)), "dump_signal", int(signal.SIGUSR2)),
    ("FRNCCL_DUMP_SIGNAL", "none", "dump_signal", 0),
    ("FRNCCL_DUMP_SIGNAL", "0", "dump_signal", 0),
    ("FRNCCL_DUMP_SIGNAL", "off", "dump_signal", 0),
    ("FRNCCL_DUMP_SIGNAL", "SIGKILL", "dump_signal", E),
    ("FRNCCL_DUMP_SIGNAL", "9", "dump_signal", E),
    ("FRNCCL_DUMP_SIGNAL", "SIGSTOP", "dump_signal", E),
    ("FRNCCL_DUMP_SIGNAL", "SIGSEGV", "dump_signal", E),
    ("FRNCCL_DUMP_SIGNAL", "SIGTERM", "dump_signal", E),
    ("FRNCCL_DUMP_SIGNAL", "SIGINT", "dump_signal", E),
    ("FRNCCL_DUMP_SIGNAL", "SIGFOO", "dump_signal", E),
    ("FRNCCL_DUMP_SIGNAL", "-1", "dump_signal", E),
    ("FRNCCL_DUMP_SIGNAL", str(signal.NSIG), "dump_signal", E),
    ("FRNCCL_DUMP_ON_TEARDOWN", "", "dump_on_teardown", False),
    ("FRNCCL_DUMP_ON_TEARDOWN", "yes", "dump_on_teardown", True),
    ("FRNCCL_DUMP_ON_TEARDOWN", "OFF", "dump_on_teardown", False),
    ("FRNCCL_DUMP_ON_TEARDOWN", "2", "dump_on_teardown", E),
    ("FRNCCL_GPU_TIMING", "", "gpu_timing_every", 0),
    ("FRNCCL_GPU_TIMING", "off", "gpu_timing_every", 0),
    ("FRNCCL_GPU_TIMING", "0", "gpu_timing_every", 0),
    ("FRNCCL_GPU_TIMING", "ALL", "gpu_timing_every", 1),
    ("FRNCCL_GPU_TIMING", "7", "gpu_timing_every", 7),
    ("FRNCCL_GPU_TIMING", "-7", "gpu_timing_every", E),
    ("FRNCCL_GPU_TIMING", "sometimes", "gpu_timing_every", E),
    ("FRNCCL_END_EVENT_INTERVAL_US", "", "end_event_interval_us", 0),
    ("FRNCCL_END_EVENT_INTERVAL_US", "1000", "end_event_interval_us", 1000),
    ("FRNCCL_END_EVENT_INTERVAL_US", "0", "end_event_interval_us", 0),
    ("FRNCCL_END_EVENT_INTERVAL_US", "250", "end_event_interval_us", 250),
    ("FRNCCL_END_EVENT_INTERVAL_US", "-1", "end_event_interval_us", E),
    ("FRNCCL_END_EVENT_INTERVAL_US", "1ms", "end_event_interval_us", E),
    ("FRNCCL_SETTLE_BY_TORCH_WATCHDOG", "", "settle_by_torch_watchdog", True),
    ("FRNCCL_SETTLE_BY_TORCH_WATCHDOG", "0", "settle_by_torch_watchdog", False),
    ("FRNCCL_SETTLE_BY_TORCH_WATCHDOG", "on", "settle_by_torch_watchdog", True),
    ("FRNCCL_SETTLE_BY_TORCH_WATCHDOG", "sometimes", "settle_by_torch_watchdog", E),
]


@pytest.mark.parametrize("name,value,attr,want", CONFIG_CASES, ids=[f"{n}={v!r}" for n, v, _, _ in CONFIG_CASES])
def test_from_env(name, value, attr, want):
    env = {name: value}
    if want is E:
        with pytest.raises(frconfig.ConfigError) as info:
            frconfig.FrConfig.from_env(env)
        message = str(info.value)
        assert name in message and "\n" not in message, message
        problems = frconfig.validate_environment(env)
        assert len(problems) == 1 and name in problems[0], problems  # `frnccl config` agrees
    else:
        assert getattr(frconfig.FrConfig.from_env(env), attr) == want
        assert frconfig.validate_environment(env) == []


def test_from_env_defaults_match_settings_table():
    cfg = frconfig.FrConfig.from_env({})
    assert cfg == frconfig.FrConfig()
    documented = {s.name: s.default for s in frconfig.SETTINGS}
    assert documented["FRNCCL_BUFFER_SIZE"] == str(cfg.buffer_size)
    assert documented["FRNCCL_STACKS"] == cfg.stacks
    assert documented["FRNCCL_DUMP_FORMATS"] == ",".join(cfg.formats)
    assert documented["FRNCCL_DUMP_TIMEOUT_SEC"] == str(cfg.dump_timeout_ms // 1000)
    assert documented["FRNCCL_COORD_CHECK_MS"] == str(cfg.coord_check_ms)
    assert documented["FRNCCL_HEARTBEAT_TIMEOUT_SEC"] == str(cfg.heartbeat_timeout_ms // 1000)
    assert documented["FRNCCL_WATCHDOG_POLL_MS"] == str(cfg.watchdog_poll_ms)
    assert documented["FRNCCL_SYMBOLIZE_TIMEOUT_MS"] == str(cfg.symbolize_timeout_ms)
    assert documented["FRNCCL_ON_TIMEOUT"] == cfg.on_timeout
    assert documented["FRNCCL_DUMP_SIGNAL"] == signal.Signals(cfg.dump_signal).name
    assert cfg.gpu_timing_every == 0 and documented["FRNCCL_GPU_TIMING"] == "off"
    assert documented["FRNCCL_END_EVENT_INTERVAL_US"] == str(cfg.end_event_interval_us)
    assert documented["FRNCCL_SETTLE_BY_TORCH_WATCHDOG"] == str(int(cfg.settle_by_torch_watchdog))


def test_from_env_dump_dir(tmp_path):
    assert frconfig.FrConfig.from_env({"FRNCCL_DUMP_DIR": str(tmp_path / "new")}).dump_dir == str(tmp_path / "new")
    rel = frconfig.FrConfig.from_env({"FRNCCL_DUMP_DIR": "rel/dir"}).dump_dir
    assert os.path.isabs(rel) and rel.endswith(os.path.join("rel", "dir"))
    assert frconfig.FrConfig.from_env({"FRNCCL_DUMP_DIR": "~/d"}).dump_dir == os.path.expanduser("~/d")
    assert frconfig.FrConfig.from_env({}).dump_dir == frconfig.default_dump_dir()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(frconfig.ConfigError, match="FRNCCL_DUMP_DIR"):
        frconfig.FrConfig.from_env({"FRNCCL_DUMP_DIR": str(a_file)})


def test_from_env_job_id_precedence():
    job = frconfig.FrConfig.from_env
    assert job({}).job_id == ""
    assert job({"SLURM_JOB_ID": "s1"}).job_id == "s1"
    assert job({"SLURM_JOB_ID": "s1", "TORCHELASTIC_RUN_ID": "t1"}).job_id == "t1"
    assert job({"SLURM_JOB_ID": "s1", "TORCHELASTIC_RUN_ID": "t1", "FRNCCL_JOB_ID": "f1"}).job_id == "f1"
    assert job({"MAST_HPC_JOB_NAME": "m1"}).job_id == "m1"


def test_from_env_refuses_reserved_stacks_signal():
    with pytest.raises(frconfig.ConfigError, match="FRNCCL_DUMP_SIGNAL"):
        frconfig.FrConfig.from_env({"FRNCCL_DUMP_SIGNAL": str(stacks_signal())})


# --------------------------------------------------------------------------------------------
# docs
# --------------------------------------------------------------------------------------------


def test_generated_docs_up_to_date():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"], capture_output=True,
                          text=True, timeout=60, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_caller_stacks_match_extract_stack():
    """Recorded caller stacks equal traceback.extract_stack() at the call, frame by frame, through generators,
    coroutines, comprehensions, lambdas, threads, a cut-off deep recursion and repeated call sites; both capture
    paths."""
    job = run_ranks("stack_capture.py", 2, timeout=JOB_TIMEOUT_S)
    for r in ok_results(job):
        assert r["ops"] == r["expected"] == 26, r
        assert r["n_mismatches"] == 0, r
        walk_expected = sys.version_info[:2] in ((3, 11), (3, 12), (3, 13))
        assert r["modes"][0].startswith("interpreter frames" if walk_expected else "public frame API"), r
        assert r["modes"][1].startswith("public frame API"), r


def run_nonutf8_caller(dump_dir: Path, formats: str) -> dict[str, Any]:
    job = run_ranks("nonutf8_caller.py", 1, timeout=JOB_TIMEOUT_S,
                    env={"FRNCCL_DUMP_DIR": str(dump_dir), "FRNCCL_STACKS": "python", "FRNCCL_DUMP_FORMATS": formats})
    job.assert_ok()
    return job.results()[0]["files"]


def test_caller_file_name_not_utf8_is_dumped_not_a_crash(tmp_path):
    """A source file in a folder named in Latin-1: its code object's file name holds a lone surrogate,
    for which PyUnicode_AsUTF8 gives nullptr (a segfault at dump time, when it was assigned to a string)."""
    files = run_nonutf8_caller(tmp_path / "dumps", "compact")
    assert list(files) == ["compact/frnccl_rank_0.json.gz"], files
    names = files["compact/frnccl_rank_0.json.gz"].get("filenames")
    assert names and "/data/caf\\udce9/train.py" in names, files


@pytest.mark.parametrize("formats", ["compact", "pickle", "json"])
def test_thread_name_of_no_utf8_is_made_valid(tmp_path, formats):
    """Bytes that look like UTF-8 but are not (an overlong sequence, a code point past U+10FFFF) made the whole
    file unreadable: Python's UTF-8 decoder refuses them where the writer's check let them through."""
    files = run_nonutf8_caller(tmp_path / "dumps", formats)
    assert len(files) == 1, files
    (got,) = files.values()
    assert got.get("thread_names") == ["w??????k"], files


def test_compact_of_real_dump_reads_from_columns(dump_job, tmp_path, monkeypatch):
    """The real dumps, compact-encoded: the analyzer's columnar reading gives the row path's summary. As
    written (p2p ops: the row path reads them) and without the p2p ops (every group read from its columns)."""
    from fr_backend import compact
    from fr_backend.analyzer import columnar, load
    from fr_backend.analyzer.load import summarize

    for r, d in dump_job["dumps"].items():
        colls = dict(d, entries=[e for e in d["entries"] if not e["is_p2p"]])
        assert len(colls["entries"]) >= 6 and len(colls["entries"]) < len(d["entries"]) or r == 0
        for name, dump in (("as_written", d), ("collectives", colls)):
            path = tmp_path / f"{name}_frnccl_rank_{r}.json.gz"
            path.write_bytes(compact.encode(dump))
            want = summarize(load.load_dump(path), str(path), None)
            with monkeypatch.context() as m:
                if name == "collectives":
                    m.setattr(columnar, "_rows", lambda obj: pytest.fail("the row path was taken"))
                got = summarize(columnar.read_dump(path), str(path), None)
            assert got == want, (r, name)
            assert sum(len(rp.c_seq) for rp in got.pgs.values()) >= 6
