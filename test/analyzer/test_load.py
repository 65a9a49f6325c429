"""Safe loading, discovery and bad input."""

import json
import os
import pickle
import signal

import pytest
from conftest import analyse, faults

from fr_backend.analyzer.load import DumpError, InputError, UnsafePickleError, discover, load, load_dump
from fr_backend.analyzer.report import run
from fr_backend.analyzer.synth import Job


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "pwned"
    p = tmp_path / "nccl_trace_rank_0"
    p.write_bytes(pickle.dumps({"version": "2.10", "entries": [], "pg_config": {}, "x": _Evil(marker)}, protocol=2))
    with pytest.raises(UnsafePickleError, match="posix.system|os.system|refused"):
        load_dump(p)
    assert not marker.exists()
    # protocol 4 uses STACK_GLOBAL: same refusal
    p.write_bytes(pickle.dumps(_Evil(marker), protocol=4))
    with pytest.raises(UnsafePickleError):
        load_dump(p)
    assert not marker.exists()


def test_malicious_rank_among_good_ones_is_reported_and_rest_analysed(tmp_path):
    j = Job(4)
    for _ in range(3):
        j.collective()
    d = j.write(tmp_path, "torch")
    marker = tmp_path / "pwned"
    with open(os.path.join(d, "nccl_trace_rank_2"), "wb") as f:
        pickle.dump(_Evil(marker), f)
    res = load([d], jobs=1)
    assert not marker.exists()
    assert sorted(res.ranks) == [0, 1, 3]
    assert res.missing == [2]
    assert [os.path.basename(p.path) for p in res.problems] == ["nccl_trace_rank_2"]
    assert "refused" in res.problems[0].reason


def test_plain_types_round_trip(tmp_path):
    d = {"version": "3.0", "entries": [], "pg_config": {}, "b": b"x", "t": (1, 2.5, None, True), "s": "é"}
    p = tmp_path / "f"
    p.write_bytes(pickle.dumps(d, protocol=5))
    assert load_dump(p) == d


@pytest.mark.parametrize("content,reason", [
    (b"", "empty"),
    (b"\x80\x02}q\x00(X\x07\x00\x00\x00", "corrupt or truncated pickle"),
    (b"{\"version\": \"2.10\", \"entr", "corrupt or truncated JSON"),
    (b"hello world", "not a pickle or JSON"),
    (b"[1, 2, 3]", "not a flight-recorder dump"),
    (b"{\"foo\": 1}", "not a flight-recorder dump"),
])
def test_bad_files_raise_dump_error(tmp_path, content, reason):
    p = tmp_path / "nccl_trace_rank_0"
    p.write_bytes(content)
    with pytest.raises(DumpError, match=reason):
        load_dump(p)


def test_truncated_file_named_and_others_analysed(tmp_path):
    j = Job(4)
    j.collective()
    j.collective(ranks=[0, 1, 2], state="started")
    inc = j.write(tmp_path, "pickle")
    p = os.path.join(inc, "pickle", "frnccl_rank_1")
    data = open(p, "rb").read()
    open(p, "wb").write(data[: len(data) // 2])
    a = analyse_dir(inc)
    assert [pr.path for pr in a.res.problems] == [p]
    assert a.res.missing == [1]
    assert faults(a)[0].kind == "not_joined" and faults(a)[0].culprit_ranks == [3]


def analyse_dir(d):
    from fr_backend.analyzer.report import run
    return run([str(d)], jobs=1)


def test_json_fallback_when_pickle_corrupt_and_pickle_preferred(tmp_path):
    j = Job(2)
    j.collective()
    inc = j.write(tmp_path, "pickle")
    j.write(tmp_path, "json")
    cands, _ = discover([inc])
    assert [os.path.basename(c.paths[0]) for c in cands] == ["frnccl_rank_0", "frnccl_rank_1"]
    open(os.path.join(inc, "pickle", "frnccl_rank_1"), "wb").write(b"\x80\x02garbage")
    res = load([inc], jobs=1)
    assert res.ranks[1].path.endswith("frnccl_rank_1.json")
    assert res.ranks[0].path.endswith(os.path.join("pickle", "frnccl_rank_0"))
    assert any("used" in n for n in res.notes)


def test_latest_incident_and_explicit_incident(tmp_path):
    j = Job(2)
    j.collective()
    j.write(tmp_path, "pickle", incident="20260101-000000-timeout-0")
    j.write(tmp_path, "json", incident="20260102-000000-manual-1")
    (tmp_path / "20270101-not-an-incident").mkdir()
    _, src = discover([str(tmp_path)])
    assert src.endswith("20260102-000000-manual-1")
    _, src = discover([str(tmp_path)], incident="20260101-000000-timeout-0")
    assert src.endswith("20260101-000000-timeout-0")
    with pytest.raises(InputError, match="no incident"):
        discover([str(tmp_path)], incident="nope")


def test_torch_pickle_and_json_dumps(tmp_path):
    for fmt in ("torch", "torch_json"):
        j = Job(4)
        for _ in range(3):
            j.collective()
        j.collective(ranks=[0, 1, 3], state="started")
        a = analyse(j, tmp_path / fmt, fmt)
        assert a.res.ranks[0].fmt == "torch"
        assert sorted(a.res.ranks) == [0, 1, 2, 3]
        assert faults(a)[0].kind == "not_joined" and faults(a)[0].culprit_ranks == [2]


def test_explicit_file_list_and_missing_rank(tmp_path):
    j = Job(4)
    j.collective()
    d = j.write(tmp_path, "torch")
    files = [os.path.join(d, f"nccl_trace_rank_{r}") for r in (3, 0, 1)]
    from fr_backend.analyzer.report import run
    a = run(files, jobs=1)
    assert sorted(a.res.ranks) == [0, 1, 3]
    assert a.res.missing == [2]
    assert [f.kind for f in a.findings] == ["missing_dump"]
    assert a.findings[0].severity == "info" and a.findings[0].ranks == [2]


def test_gloo_pg_config_with_empty_name(tmp_path):
    j = Job(2, backend="gloo")
    for _ in range(3):
        j.collective()
    d = tmp_path / "d"
    d.mkdir()
    for r in range(2):
        dump = j.dump(r, torch_format=True)
        dump["pg_config"] = {"0": {"name": "", "desc": "default_pg", "ranks": "[0, 1]"}}
        (d / f"gloo_rank_{r}.json").write_text(json.dumps(dump))
    a = analyse_dir(d)
    assert a.findings == []
    assert a.res.world_size == 2


def test_parallel_load_matches_serial(tmp_path):
    j = Job(70)
    for _ in range(3):
        j.collective()
    j.collective(ranks=[r for r in range(70) if r != 33], state="started")
    inc = j.write(tmp_path, "pickle")
    from fr_backend.analyzer.report import run, to_json
    a1, a2 = run([inc], jobs=1), run([inc], jobs=2)
    assert to_json(a1) == to_json(a2)
    assert faults(a2)[0].culprit_ranks == [33]


def test_no_usable_input(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load([str(tmp_path / "nope")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no dump files"):
        load([str(tmp_path / "empty")])
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a_1").write_bytes(b"junk")
    with pytest.raises(InputError, match="no usable dump"):
        load([str(tmp_path / "junk")])


def test_mixed_frnccl_and_torch_dumps_in_one_folder(tmp_path):
    j = Job(4)
    for _ in range(2):
        j.collective()
    j.collective(ranks=[0, 2, 3], state="started")
    d = tmp_path / "mixed"
    d.mkdir()
    (d / "frnccl_rank_0").write_bytes(pickle.dumps(j.dump(0), protocol=2))
    (d / "frnccl_rank_1.json").write_text(json.dumps(j.dump(1)))
    (d / "nccl_trace_rank_2").write_bytes(pickle.dumps(j.dump(2, torch_format=True), protocol=2))
    (d / "nccl_trace_rank_3.json").write_text(json.dumps(j.dump(3, torch_format=True)))
    a = analyse_dir(d)
    assert {r: s.fmt for r, s in a.res.ranks.items()} == {0: "frnccl", 1: "frnccl", 2: "torch", 3: "torch"}
    f = faults(a)[0]
    assert (f.kind, f.culprit_ranks) == ("not_joined", [1])


_PARENT = os.getpid()


def _killed_on(victim):
    """load._load_path, but the worker process reading ``victim`` is SIGKILLed mid-file (as the kernel's
    OOM killer, or anyone from outside, would)."""
    from fr_backend.analyzer import load as L

    real = L._load_path

    def load_path(path, hint):
        if path == victim:
            assert os.getpid() != _PARENT, "read in the analyzing process, not in a worker"
            os.kill(os.getpid(), signal.SIGKILL)
        return real(path, hint)

    return load_path


@pytest.mark.parametrize("jobs", [1, 2])
def test_worker_killed_mid_file_costs_only_that_file(tmp_path, monkeypatch, jobs):
    """A worker killed while it reads rank 5: that file is refused in one line naming the signal, a new worker
    reads the ranks after it, and the verdict (rank 6 never joined) stands. Before, a dead worker broke the
    whole pool and the files left were read again in the analyzing process, the killer file included."""
    from fr_backend.analyzer import load as L

    j = Job(8)
    j.collective()
    j.collective(ranks=[r for r in range(8) if r != 6], state="started")
    inc = j.write(tmp_path, "pickle")
    victim = os.path.join(inc, "pickle", "frnccl_rank_5")
    monkeypatch.setattr(L, "_load_path", _killed_on(victim))
    res = load([inc], jobs=jobs, isolate=True)
    assert sorted(res.ranks) == [0, 1, 2, 3, 4, 6, 7]
    assert [(p.path, p.reason) for p in res.problems] == [
        (victim, "refused: the process reading it was killed by SIGKILL (out of memory, or killed from outside)")]
    a = run([inc], jobs=jobs, isolate=True)
    assert faults(a)[0].kind == "not_joined" and faults(a)[0].culprit_ranks == [6]


def test_worker_killed_on_a_pickle_falls_back_to_its_json(tmp_path, monkeypatch):
    """Only the file a worker died on is lost: the same rank's JSON dump is read instead."""
    from fr_backend.analyzer import load as L

    j = Job(4)
    j.collective()
    inc = j.write(tmp_path, "pickle")
    j.write(tmp_path, "json")
    victim = os.path.join(inc, "pickle", "frnccl_rank_2")
    monkeypatch.setattr(L, "_load_path", _killed_on(victim))
    res = load([inc], jobs=2, isolate=True)
    assert sorted(res.ranks) == [0, 1, 2, 3] and res.ranks[2].path.endswith("json/frnccl_rank_2.json")
    assert [p.path for p in res.problems] == [victim]
    assert f"rank 2: used {res.ranks[2].path} instead" in res.notes


def test_isolated_reads_keep_order_and_progress(tmp_path):
    """Read in workers, the result is the one read in this process, and progress counts every file once."""
    j = Job(8)
    for _ in range(4):
        j.collective()
    inc = j.write(tmp_path, "pickle")
    seen = []
    iso = load([inc], jobs=3, isolate=True, progress=lambda done, total: seen.append((done, total)))
    here = load([inc], jobs=1)
    assert seen == [(i, 8) for i in range(1, 9)]
    assert list(iso.ranks) == list(here.ranks) and iso.problems == here.problems == []
    assert all(iso.ranks[r].pgs.keys() == here.ranks[r].pgs.keys() for r in here.ranks)


def _per_rank_incidents(tmp_path, world=8, dead=0, stamp="20260101-000000", step_ms=7):
    """The store host (rank ``dead``) died: each other rank wrote its own incident, '<time>-timeout-r<R>-local'."""
    j = Job(world)
    for _ in range(5):
        j.collective()
    j.collective(ranks=[r for r in range(world) if r != dead], state="started")
    for r in range(world):
        if r != dead:
            j.write(tmp_path, ranks=[r], incident=f"{stamp}.{100 + r * step_ms:03d}-timeout-r{r}-local")
    return j


def test_per_rank_incidents_are_read_together(tmp_path):
    _per_rank_incidents(tmp_path)
    a = analyse_dir(tmp_path)
    assert sorted(a.res.ranks) == list(range(1, 8)) and a.res.missing == [0]
    f = faults(a)[0]
    assert (f.kind, f.culprit_ranks, f.victims) == ("missing_dump", [0], list(range(1, 8)))
    assert any("per-rank incidents" in n and "--incident" in n for n in a.res.notes), a.res.notes
    # one of them alone, on request
    from fr_backend.analyzer.report import run
    a = run([str(tmp_path)], incident="20260101-000000.114-timeout-r2-local", jobs=1)
    assert sorted(a.res.ranks) == [2]


def test_per_rank_incidents_of_another_time_are_not_mixed_in(tmp_path):
    _per_rank_incidents(tmp_path / "x", stamp="20260101-000000")
    j = Job(8)
    j.collective()
    j.write(tmp_path / "x", ranks=[7], incident="20260102-000000.000-manual-r7")  # a day later, rank 7 alone
    a = analyse_dir(tmp_path / "x")
    assert sorted(a.res.ranks) == [7] and a.res.elsewhere == {}


def test_ranks_of_a_job_wide_incident_found_in_a_sibling_are_not_called_missing(tmp_path):
    """A job-wide incident without rank 3 (it died before writing); rank 3 wrote its own incident a second
    earlier. The analysis names the sibling, says how to read both, and does not call rank 3 plain missing."""
    j = Job(4)
    for _ in range(3):
        j.collective()
    j.collective(ranks=[0, 1, 2], state="started")
    j.write(tmp_path, ranks=[3], incident="20260101-000000.100-error-r3-local")
    j.write(tmp_path, ranks=[0, 1, 2], incident="20260101-000001.000-timeout-r0")
    a = analyse_dir(tmp_path)
    assert sorted(a.res.ranks) == [0, 1, 2]
    assert list(a.res.elsewhere) == [3] and a.res.elsewhere[3].endswith("20260101-000000.100-error-r3-local")
    assert any("frnccl analyze" in n and "error-r3-local" in n for n in a.res.notes), a.res.notes
    f = faults(a)[0]
    assert f.kind == "missing_dump" and "sibling" in f.detail and "the likely culprit" not in f.detail
    from fr_backend.analyzer.report import to_text
    assert "missing: rank 3" not in to_text(a)


def test_default_jobs_uses_cores_up_to_memory(monkeypatch):
    """Loader workers: every usable core, at most MAX_JOBS, one per WORKER_BYTES of available memory."""
    from fr_backend.analyzer import load as L

    monkeypatch.setattr(L, "_cores", lambda: 64)
    monkeypatch.setattr(L, "_available_bytes", lambda: 1 << 40)
    assert L.default_jobs() == L.MAX_JOBS
    monkeypatch.setattr(L, "_cores", lambda: 8)
    assert L.default_jobs() == 8  # was min(4, cores)
    monkeypatch.setattr(L, "_available_bytes", lambda: 3 * L.WORKER_BYTES + 5)
    assert L.default_jobs() == 3
    monkeypatch.setattr(L, "_available_bytes", lambda: 100)
    assert L.default_jobs() == 1
    monkeypatch.setattr(L, "_available_bytes", lambda: None)  # not Linux: cores alone
    assert L.default_jobs() == 8


def _incident_with_a_planted_rank_2(tmp_path, plant: str):
    """A real 4-rank incident (compact and pickle) where rank 2 never joins, and compact/frnccl_rank_02.json.gz
    beside its real file, claiming rank 2: `copy_of_0` is rank 0's dump relabelled, `lookalike` rank 2's own
    header (incident, host, job) with another pid and rank 2 inside the collective like the others."""
    from fr_backend import compact

    j = Job(4)
    for _ in range(3):
        j.collective()
    j.collective(ranks=[0, 1, 3], state="started")
    from pathlib import Path

    inc = Path(j.write(tmp_path / "dumps", "compact"))
    j.write(tmp_path / "dumps", "pickle")
    if plant == "copy_of_0":
        fake = load_dump(inc / "compact" / "frnccl_rank_0.json.gz")
    else:
        j2 = Job(4)
        for _ in range(3):
            j2.collective()
        j2.collective(ranks=[0, 1, 2, 3], state="started")
        fake = j2.dump(2)
        fake["pid"] += 7
    fake["rank"] = 2
    (inc / "compact" / "frnccl_rank_02.json.gz").write_bytes(compact.encode(fake))
    return inc


def _cli_json(inc) -> tuple[int, dict]:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "fr_backend.cli", "analyze", str(inc.parent), "--json"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [os.path.join(os.path.dirname(__file__), "..", "..", "python"),
                               os.environ.get("PYTHONPATH", "")])})
    return proc.returncode, json.loads(proc.stdout)


def test_a_planted_file_claiming_a_rank_does_not_replace_its_dump(tmp_path):
    """A relabelled copy of rank 0's dump, named frnccl_rank_02 (sorted before frnccl_rank_2), silently replaced
    the real rank 2: the verdict went from rank 2 not_joined to no single rank stuck. The file the other ranks'
    dumps agree with (rank 0's host and pid are rank 0's) is used, and the report says so."""
    inc = _incident_with_a_planted_rank_2(tmp_path, "copy_of_0")
    a = run([str(inc.parent)], jobs=1)
    assert (faults(a)[0].kind, faults(a)[0].culprit_ranks) == ("not_joined", [2]), [n for n in a.res.notes]
    assert a.res.ranks[2].path.endswith(os.path.join("compact", "frnccl_rank_2.json.gz"))
    (c,) = a.res.conflicts
    assert c.rank == 2 and c.used == a.res.ranks[2].path and len(c.paths) == 2, c
    assert any("rank 2: 2 usable files claim it" in n and "is another rank's" in n for n in a.res.notes), a.res.notes
    rc, out = _cli_json(inc)
    assert rc == 1 and out["findings"][0]["culprit_ranks"] == [2], out
    assert [(x["rank"], x["used"]) for x in out["rank_conflicts"]] == [(2, c.used)] and out["ranks_undecided"] == []


def test_two_files_that_both_fit_leave_the_rank_undecided(tmp_path):
    """A lookalike of rank 2's dump (same incident, host and world size; another pid) that shows rank 2 inside
    the collective: nothing in the dumps tells which file is rank 2's own, so neither is used, and no finding
    names rank 2 (nor any other rank as the culprit): "cannot tell" rather than a wrong name."""
    inc = _incident_with_a_planted_rank_2(tmp_path, "lookalike")
    a = run([str(inc.parent)], jobs=1)
    assert 2 not in a.res.ranks and a.res.undecided == {2}
    for f in a.findings:
        assert 2 not in f.culprit_ranks and (f.severity == "info" or not f.culprit_ranks), (f.kind, f.culprit_ranks)
    assert any("which is its own cannot be told" in n for n in a.res.notes), a.res.notes
    rc, out = _cli_json(inc)
    assert out["ranks_undecided"] == [2] and out["rank_conflicts"][0]["used"] is None, out
    assert all(2 not in f["culprit_ranks"] for f in out["findings"]), out


def _tagged(tmp_path, incident: str, tags: dict[int, str]) -> None:
    """A 2-rank hang (rank 1 never issued seq 2) written as JSON dumps whose headers carry ``tags``."""
    j = Job(2)
    j.collective()
    j.collective(ranks=[0], state="started")
    folder = tmp_path / incident / "json"
    folder.mkdir(parents=True)
    for r, tag in tags.items():
        d = j.dump(r, incident=incident)
        d["job_tag"] = tag
        (folder / f"frnccl_rank_{r}.json").write_text(json.dumps(d))


def test_a_dump_of_another_job_in_one_incident_is_left_out(tmp_path):
    """One incident folder whose two dumps name two jobs (an older frnccl's two jobs whose incidents fell in one
    millisecond, or files put together by hand): the first job's dump is read, the other's is left out with a
    note and never read as a rank of the same job; --job reads the other; a tag that is no tag names no job."""
    _tagged(tmp_path, "20260101-000000.000-timeout-r0", {0: "0000000a", 1: "0000000b"})
    a = run([str(tmp_path)], jobs=1)
    assert sorted(a.res.ranks) == [0] and a.res.job_tag == "0000000a", a.res.notes
    assert any("rank 1 of job 0000000b left out" in n for n in a.res.notes), a.res.notes
    a = run([str(tmp_path)], jobs=1, job="0000000b")
    assert sorted(a.res.ranks) == [1] and a.res.job_tag == "0000000b"
    with pytest.raises(InputError, match="no dump of job ffffffff"):
        run([str(tmp_path)], jobs=1, job="ffffffff")
    _tagged(tmp_path / "odd", "20260101-000000.000-timeout-r0", {0: "../x", 1: ""})
    a = run([str(tmp_path / "odd")], jobs=1)
    assert sorted(a.res.ranks) == [0, 1] and a.res.job_tag == ""
