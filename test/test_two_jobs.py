"""Two jobs that share one dump folder (#45 item 6): each 2-rank job (its own store) hangs, rank 1 away from
all_reduce WARMUP+1, and is ended with SIGTERM, so that each rank writes an incident of its own. The
analyzer reads per-rank incidents of one event together; it must never read one job's rank with another's."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

import fr_backend
from dist_harness import JobThread, run_ranks, wait_for
from test_verdict import analyze

WARMUP = {"A": 2, "B": 4}  # different, so that a verdict over a mix of the two names no job's op
JOB_BOUND_S = 60


def dumps_by_pid(dump_dir: Path) -> dict[int, tuple[Path, dict]]:
    out = {}
    for p in dump_dir.glob("*/compact/frnccl_rank_*.json.gz"):
        d = fr_backend.load_dump(str(p))
        out[d["pid"]] = (p, d)
    return out


@pytest.mark.timeout(120)
def test_two_jobs_in_one_dump_folder_are_never_mixed(tmp_path):
    dump_dir = tmp_path / "dumps"
    env = {"FRNCCL_DUMP_DIR": str(dump_dir), "FRNCCL_DUMP_TIMEOUT_SEC": "3"}
    states = {name: tmp_path / name for name in WARMUP}
    jobs = {}
    for name, state in states.items():
        state.mkdir()
        jobs[name] = JobThread(lambda w=WARMUP[name], s=state: run_ranks("two_jobs.py", 2, str(w), str(s),
                                                                        timeout=JOB_BOUND_S, env=env))
    for name, state in states.items():
        wait_for(lambda s=state: all((s / f"pid_{r}").exists() for r in (0, 1)), 60, f"job {name} to hang", jobs[name])
    pids = {name: [int((state / f"pid_{r}").read_text()) for r in (0, 1)] for name, state in states.items()}
    # Rank 0 (its store's host) first, so that rank 1's op never fails on its closed connection; B's rank 0 before
    # A's and B's rank 1 last: B's rank 1 writes the newest incident, and A's rank 0 the newest rank-0 one before it.
    for name, rank in (("B", 0), ("A", 0), ("A", 1), ("B", 1)):
        os.kill(pids[name][rank], signal.SIGTERM)
        wait_for(lambda p=pids[name][rank]: p in dumps_by_pid(dump_dir), 30, f"job {name} rank {rank}'s SIGTERM dump")
    for bg in jobs.values():
        bg.finish(JOB_BOUND_S + 30)
    dumps = dumps_by_pid(dump_dir)
    assert set(dumps) == set(pids["A"] + pids["B"]), sorted(p.parent.parent.name for p, _ in dumps.values())

    def own_verdict(report: dict, name: str) -> None:
        want = (["not_joined"], [1], WARMUP[name] + 1)
        f = report["findings"][:1]
        got = ([x["kind"] for x in f], f[0]["culprit_ranks"] if f else [], f[0]["collective_seq_id"] if f else None)
        assert got == want, f"job {name}: want its own verdict {want}, got {got}\n{json.dumps(report, indent=1)}"
        read = report["incidents_read"]
        assert sorted(read) == sorted(dumps[p][0].parent.parent.name for p in pids[name]), (name, read)

    # The folder: the newest job's incidents only, and one line saying another job's were left out.
    report = analyze(str(dump_dir))
    own_verdict(report, "B")
    left_out = [n for n in report["notes"] if "other job" in n]
    assert len(left_out) == 1, report["notes"]
    # Each job's dumps agree on one identity, in their header and their incident's name; the two differ.
    tags = {}
    for name in WARMUP:
        mine = {dumps[p][1]["job_tag"] for p in pids[name]}
        assert len(mine) == 1 and "" not in mine, (name, mine)
        tags[name] = mine.pop()
        assert all(tags[name] in dumps[p][0].parent.parent.name for p in pids[name])
    assert tags["A"] != tags["B"], tags
    assert tags["A"] in left_out[0], left_out
    # The other job, asked for by its identity.
    own_verdict(analyze(str(dump_dir), "--job", tags["A"]), "A")
