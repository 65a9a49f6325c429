"""The verdict for programs: the JSON verdict file, fr_backend.on_verdict, and the restart loop of docs/usage.md.

Real torchrun jobs (--standalone, 4 workers on CPU) with a hard time bound; the restart loop is the code block of
docs/usage.md, run as it is written there.
"""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path

import pytest

from dist_harness import WORKERS, run_commands
from test_incidents import _torchrun_env, hang_env, only_incident

ROOT = Path(__file__).resolve().parents[1]
WORLD = 4
STUCK = 3
PG_TIMEOUT_S = 3
LOOP_BOUND_S = 240


def restart_loop_source() -> str:
    text = (ROOT / "docs" / "usage.md").read_text()
    m = re.search(r"<!-- restart loop: test/test_restart_loop.py -->\n```python\n(.*?)\n```", text, re.S)
    assert m, "docs/usage.md has no restart loop block"
    return m.group(1)


def torchrun_cmd(script: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--standalone",
            "--max-restarts", "0", "--monitor-interval", "0.2", str(WORKERS / script), *args]


@pytest.mark.timeout(LOOP_BOUND_S + 30)
def test_restart_loop_leaves_the_culprits_host_out(tmp_path):
    """Rank 3 hangs (its host is bad): the first run fails with a verdict naming rank 3 on this host, the loop
    prints the Slurm --exclude it would pass and runs the job again told to leave that host out, and the second
    run is clean. The verdict file the first run wrote says what the log said."""
    loop = tmp_path / "restart_loop.py"
    loop.write_text(restart_loop_source())
    work = tmp_path / "work"
    work.mkdir()
    env = _torchrun_env({**hang_env(tmp_path, 20), "INCIDENT_PG_TIMEOUT": str(PG_TIMEOUT_S)})
    job = run_commands([[sys.executable, str(loop), *torchrun_cmd("restart_job.py", str(STUCK))]], [env],
                       LOOP_BOUND_S, cwd=str(work))
    log = job.describe()
    assert not job.timed_out and job.ranks[0].returncode == 0, log
    out = job.ranks[0].output
    host = socket.gethostname()
    said = re.findall(r"^restart: run (\d+): (\w+): ranks \[([\d, ]*)\] on (\S+) \((\w+), group (\S+), seq (\d+)\); "
                      r"next run: srun --exclude=(\S+) \.\.\.$", out, re.M)
    assert said == [("0", "not_joined", str(STUCK), host, "all_reduce", "0", "4", host)], log
    clean = f"RUN CLEAN: {WORLD ** 4}"  # ones, all-reduced in 3 warm-up steps and the last one
    assert out.count(clean) == 1 and out.index("RUN CLEAN") > out.index("restart: run 0"), log
    # The first run's incident holds the same verdict as JSON, with the stuck rank's host and pid.
    folder = only_incident(tmp_path / "dumps", log)
    verdict = json.loads((folder / "verdict.json").read_text())
    pid = int(re.search(rf"rank {STUCK} pid (\d+) host", out).group(1))
    assert (verdict["kind"], verdict["culprit_ranks"], verdict["culprits"]) == (
        "not_joined", [STUCK], [{"rank": STUCK, "host": host, "pid": pid}]), verdict
    assert (verdict["op"], verdict["pg"], verdict["collective_seq_id"], verdict["victim_ranks"]) == (
        "all_reduce", "0", 4, [0, 1, 2]), verdict
    assert verdict["line"] in out and 0 < verdict["seconds_to_verdict"] < 20, verdict
    # The loop removed the first run's file before the second, and the clean run wrote none.
    assert not (work / "frnccl-verdict.json").exists()


def test_verdict_json_agrees_with_the_analyzer_and_reaches_every_rank(tmp_path):
    """The verdict file's fields are the analyzer's: kind, culprit_ranks, op, pg and collective_seq_id of the
    first finding of `frnccl analyze --json`; every rank's on_verdict callback got the same verdict."""
    from test_incidents import analyze

    verdict_file = tmp_path / "latest-verdict.json"
    env = {**hang_env(tmp_path, 20), "INCIDENT_PG_TIMEOUT": str(PG_TIMEOUT_S), "FRNCCL_VERDICT_FILE": str(verdict_file),
           "RESTART_JOB_ON_VERDICT": str(tmp_path / "seen")}
    job = run_commands([torchrun_cmd("restart_job.py", str(STUCK))], [_torchrun_env(env)], 120)
    log = job.describe()
    assert not job.timed_out and job.ranks[0].returncode != 0, log
    verdict = json.loads(verdict_file.read_text())
    folder = only_incident(tmp_path / "dumps", log)
    assert json.loads((folder / "verdict.json").read_text()) == verdict
    rc, report, raw = analyze(tmp_path / "dumps")
    first = report["findings"][0]
    for key in ("kind", "culprit_ranks", "op", "pg", "pg_desc", "collective_seq_id"):
        assert verdict[key] == first[key], (key, verdict[key], first[key], raw)
    assert sorted(verdict["victim_ranks"]) == sorted(first["victim_ranks"]), raw
    # Every rank's callback saw it (the stuck one too, until torchrun stopped it: it may not have written).
    seen = {int(p.name.rsplit("_", 1)[1]): json.loads(p.read_text()) for p in (tmp_path / "seen").glob("rank_*")}
    assert set(range(WORLD)) - {STUCK} <= set(seen), (sorted(seen), log)
    for r, got in seen.items():
        assert got == {"incident_id": folder.name, "kind": "not_joined", "culprit_ranks": [STUCK],
                       "culprit_hosts": [socket.gethostname()]}, (r, got)


GOOD = {"schema": "frnccl-verdict", "version": 1, "incident_id": "i", "incident_dir": "/d/i", "decided": True,
        "kind": "not_joined", "culprit_ranks": [3], "culprits": [{"rank": 3, "host": "h", "pid": 7}],
        "victim_ranks": [0, 1, 2], "op": "all_reduce", "pg": "0", "pg_desc": "default_pg", "collective_seq_id": 4,
        "p2p_seq_id": None, "undecided_reason": "", "line": "frnccl: verdict: ...", "world_size": 4,
        "ranks_wrote": 4, "judged_by_rank": 0, "seconds_to_verdict": 1.5, "time_ns": 1}


@pytest.mark.parametrize("edit, why", [
    ({"schema": "other"}, "not a verdict"),
    ({"version": 2}, "verdict version '2'"),
    ({"version": True}, "verdict version 'True'"),
    ({"culprit_ranks": [4]}, "culprit_ranks is not a list of distinct ranks"),
    ({"culprit_ranks": ["3"]}, "culprit_ranks is not a list of distinct ranks"),
    ({"culprits": [{"rank": 2, "host": "h", "pid": 7}]}, "not one of culprit_ranks"),
    ({"culprits": [{"rank": 3, "host": ["h"], "pid": 7}]}, "its host is not a host name"),
    ({"culprits": [{"rank": 3, "host": "h --exclude=all; rm -rf /", "pid": 7}]}, "its host is not a host name"),
    ({"culprits": [{"rank": 3, "host": "-x", "pid": 7}]}, "its host is not a host name"),
    ({"culprits": [{"rank": 3, "host": "h\u001b[31m", "pid": 7}]}, "its host is not a host name"),
    ({"kind": "undecided"}, "is not a verdict's"),
    ({"kind": "rm -rf"}, "is not a verdict's"),
    ({"world_size": 0}, "world_size is not a positive count"),
    ({"seconds_to_verdict": "soon"}, "seconds_to_verdict is not a duration"),
    ({"collective_seq_id": 2**70}, "collective_seq_id is not a count"),
    ({"incident_id": "../../etc"}, "incident_id is not an incident folder's name"),
    ({"incident_id": ".."}, "incident_id is not an incident folder's name"),
    ({"culprit_ranks": [], "culprits": []}, "a decided verdict names no rank"),
    ({"victim_ranks": [0, 0]}, "victim_ranks is not a list of distinct ranks"),
    ({"line": "frnccl: verdict\u001b[2J"}, "line is not a printable string"),
    ({"judged_by_rank": 9}, "judged_by_rank or ranks_wrote is not of a job of 4"),
    ({"ranks_wrote": 5}, "judged_by_rank or ranks_wrote is not of a job of 4"),
])
def test_hostile_verdict_file_is_refused_in_one_line(tmp_path, edit, why):
    """A file at FRNCCL_VERDICT_FILE anyone could have written: what is not a verdict of this format is refused
    with a VerdictError naming what is wrong, never half-read; a sound one reads back whole."""
    from fr_backend.verdict import VerdictError, read_verdict_file

    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD))
    v = read_verdict_file(good)
    assert (v.kind, v.culprit_ranks, v.culprit_hosts, v.collective_seq_id) == ("not_joined", (3,), ("h",), 4)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**GOOD, **edit}))
    with pytest.raises(VerdictError) as err:
        read_verdict_file(bad)
    assert why in str(err.value) and "\n" not in str(err.value), err.value


@pytest.mark.parametrize("raw", [b"", b"not json", b"[" * 100_000, b"\xff\xfe", b"x" * (70 * 1024), b"[]", b"null"])
def test_verdict_file_that_is_no_json_object_is_refused(tmp_path, raw):
    from fr_backend.verdict import VerdictError, read_verdict_file

    bad = tmp_path / "bad.json"
    bad.write_bytes(raw)
    with pytest.raises(VerdictError):
        read_verdict_file(bad)


def test_verdict_file_that_is_a_fifo_is_refused_at_once(tmp_path):
    """A FIFO at the path (no writer ever comes): refused at once, never waited on."""
    import os

    from fr_backend.verdict import VerdictError, read_verdict_file

    fifo = tmp_path / "verdict.json"
    os.mkfifo(fifo)
    with pytest.raises(VerdictError, match="is not a regular file"):
        read_verdict_file(fifo)
