"""Live slow-rank detection over real jobs (fr_backend.slow): 4 ranks on gloo, one of which computes 1.3x as
long mid-run. Rank 0's log must name that rank, and only it, while it is slow, and say when it is well again;
jobs whose slowness is the program's own (one pause, every rank slowed alike) must get no slow line. The
rules themselves are tested window by window in test_slow_judge.py."""

from __future__ import annotations

import json
import re

import pytest

from dist_harness import JobThread, free_port, run_ranks
from test_incidents import run_cli

WINDOW = {"FRNCCL_SLOW_DETECT": "1", "FRNCCL_SLOW_WINDOW_SEC": "1.5"}  # a rank is named after 3 windows of baseline and 2 of slowness
SLOW_LINE = re.compile(r"^frnccl: slow: rank (\d+) \(host .+, pid \d+\) (enters|is no longer late)")


def detector_lines(job) -> list[tuple[int, str, int, str]]:
    """(line number, 'slow'/'well', rank, line) of rank 0's detector lines, and the PHASE markers as (n, phase, -1, line)."""
    out = []
    for n, line in enumerate(job.ranks[0].output.splitlines()):
        m = SLOW_LINE.match(line)
        if m:
            out.append((n, "slow" if m.group(2) == "enters" else "well", int(m.group(1)), line))
        elif line.startswith("PHASE "):
            out.append((n, line.split()[1], -1, line))
    return out


def ticks_between(job, first: int, last: int) -> int:
    return sum(1 for line in job.ranks[0].output.splitlines()[first:last] if line.startswith("T "))


def slow_job_watched(tmp_path, shape: str, slow_rank: int):
    """The job, watched while it runs through `frnccl status` and rank 0's metrics textfile: returns the job,
    the status lateness that listed the slow rank (if any did), and the shares rank 0 served for it."""
    port = free_port()
    metrics = tmp_path / f"metrics-{port}"
    bg = JobThread(lambda: run_ranks("slow_job.py", 4, timeout=180, env={
        **WINDOW, "MASTER_PORT": str(port), "FRNCCL_METRICS_DIR": str(metrics), "FRNCCL_METRICS_INTERVAL_SEC": "0.5",
        "SHAPE": shape, "MESH_TP": "2", "STEP_MS": "40",
        "SLOW_RANK": str(slow_rank), "SLOW_FACTOR": "1.3", "SLOW_FROM": "170", "SLOW_UNTIL": "370", "STEPS": "500"}))
    shown: list[dict] = []
    served: list[float] = []
    share = re.compile(r'^frnccl_rank_lateness_share\{[^}]*late_rank="%d"[^}]*\} (\S+)$' % slow_rank, re.M)
    while bg.thread.is_alive() and not (shown and max(served, default=0) >= 0.05):
        try:
            served.extend(float(v) for v in share.findall((metrics / "frnccl_rank0.prom").read_text()))
        except OSError:
            pass
        rc, out, _ = run_cli("status", "--store", f"127.0.0.1:{port}", "--json", timeout=60)
        try:
            lateness = json.loads(out.splitlines()[-1]).get("lateness") if rc == 0 else None
        except (ValueError, IndexError):
            lateness = None
        if lateness and lateness["slow"] == [slow_rank]:
            shown.append(lateness)
        bg.thread.join(1.0)
    job = bg.finish()
    job.assert_ok()
    return job, shown, served


@pytest.mark.timeout(420)
@pytest.mark.parametrize("shape,slow_rank", [("flat", 2), ("mesh", 3)])
def test_the_rank_slowed_mid_run_is_named_and_then_well_again(tmp_path, shape, slow_rank):
    """While it is slow, `frnccl status` lists it among the slow ranks with its lateness, rank 0's metrics give
    its share of the others' time, and the log names it, then says it is well. Never another rank: a job in
    which no rank was named at all (a machine so loaded that the slowdown drowned in its noise: "I don't
    know") runs once more; one that named an innocent fails at once."""
    pytest.importorskip("prometheus_client")  # scripts/install.sh --test brings it
    for attempt in range(2):
        job, shown, served = slow_job_watched(tmp_path, shape, slow_rank)
        seen = detector_lines(job)
        named = [(n, kind, rank) for n, kind, rank, _ in seen if rank >= 0]
        assert {rank for _, _, rank in named} <= {slow_rank}, (seen, job.describe())
        if named or shown:
            break
    assert shown and max(served, default=0) >= 0.05, (shown, served, seen)
    late = [x for rows in shown[0]["groups"].values() for x in rows if x["rank"] == slow_rank]
    assert late and max(x["late_ms"] for x in late) >= 2 and max(x["share"] for x in late) >= 0.05, shown
    where = {phase: n for n, phase, rank, _ in seen if rank < 0}
    assert {rank for _, _, rank in named} == {slow_rank}, (seen, job.describe())
    kinds = [kind for _, kind, _ in named]
    assert kinds == ["slow", "well"], seen
    assert where["slow"] < named[0][0] < where["well"] < named[1][0], seen
    # named within 60 s of the slowdown (rank 0 prints a tick a second)
    assert ticks_between(job, where["slow"], named[0][0]) <= 60, seen
    line = next(text for _, kind, rank, text in seen if kind == "slow" and rank >= 0)
    assert "all_reduce last in" in line and "ms late on median" in line and "of their time waiting for it" in line, line


@pytest.mark.timeout(240)
def test_a_pause_and_a_slowdown_of_every_rank_name_no_one():
    """One rank pauses 5 s once (a checkpoint); later every rank computes 1.5x as long: the program's own."""
    job = run_ranks("slow_job.py", 4, timeout=180, env={
        **WINDOW, "STEP_MS": "40", "PAUSE_RANK": "1", "PAUSE_AT": "160", "PAUSE_S": "5",
        "ALL_SLOW": "1", "SLOW_FACTOR": "1.5", "SLOW_FROM": "260", "SLOW_UNTIL": "390", "STEPS": "450"})
    job.assert_ok()
    assert job.ranks[0].output.count("PHASE ") == 2, job.describe()
    assert [line for _, _, rank, line in detector_lines(job) if rank >= 0] == []


@pytest.mark.timeout(120)
def test_off_posts_nothing_and_says_nothing():
    job = run_ranks("slow_job.py", 4, timeout=90, env={
        **WINDOW, "FRNCCL_SLOW_DETECT": "0", "STEP_MS": "40", "SLOW_RANK": "2", "SLOW_FACTOR": "2",
        "SLOW_FROM": "60", "SLOW_UNTIL": "200", "STEPS": "200"})
    job.assert_ok()
    assert not [line for r in job.ranks for line in r.output.splitlines() if "slow" in line and "frnccl" in line], job.describe()


@pytest.mark.timeout(120)
def test_a_bad_setting_is_one_line_per_rank_and_the_job_goes_on():
    job = run_ranks("slow_job.py", 2, timeout=90, env={"FRNCCL_SLOW_DETECT": "1", "FRNCCL_SLOW_WINDOW_SEC": "10s", "STEPS": "20"})
    job.assert_ok()
    for r in job.ranks:
        said = [line for line in r.output.splitlines() if line.startswith("frnccl: slow-rank detection:")]
        assert said == ["frnccl: slow-rank detection: FRNCCL_SLOW_WINDOW_SEC must be a number, got '10s'; it is off; "
                        "the job goes on"], r.output


@pytest.mark.timeout(150)
@pytest.mark.parametrize("detect", ["0", "1"])
def test_a_new_life_on_the_same_address_gets_a_fresh_store(detect):
    """The detector must not keep the first life's store (and its server in rank 0) alive past the teardown:
    the second init_process_group on the same address finds a fresh store, as it does with the detector off."""
    job = run_ranks("slow_reinit.py", 2, timeout=120, env={"FRNCCL_SLOW_DETECT": detect})
    job.assert_ok()
    said = [line for r in job.ranks for line in r.output.splitlines() if line.startswith("KEY_AFTER_REINIT ")]
    assert said == ["KEY_AFTER_REINIT False"] * 2, job.describe()
