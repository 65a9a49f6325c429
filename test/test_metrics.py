"""Progress metrics for Prometheus (fr_backend.metrics): the host endpoint, the textfiles, and every way
they can fail without touching the job. Real rank processes over a real TCPStore; the endpoint is read
with urllib and parsed with prometheus_client's own parser."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from dist_harness import JobThread, _env, free_port, run_commands, wait_for

prometheus_client = pytest.importorskip("prometheus_client", reason="prometheus_client is not installed (scripts/install.sh --test)")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = pytest.mark.timeout(240)
WORKER = Path(__file__).parent / "workers" / "metrics_job.py"


@pytest.fixture(autouse=True)
def _spool_cleanup():
    """Each test's spool folder (one per port) goes with it."""
    before = set(_spool_root().glob("*")) if _spool_root().exists() else set()
    yield
    import shutil

    for folder in (set(_spool_root().glob("*")) - before) if _spool_root().exists() else ():
        shutil.rmtree(folder, ignore_errors=True)


def _spool_root() -> Path:
    return Path(tempfile.gettempdir()) / f"frnccl-metrics-{os.getuid()}"


def scrape(port: int) -> dict[str, list[Any]]:
    """The endpoint's samples by family name; {} while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def by_rank(samples: list[Any], **labels: str) -> dict[int, float]:
    return {int(s.labels["rank"]): s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())}


def start_job(tmp_path: Path, world: int, env: dict[str, str]) -> tuple[JobThread, Path]:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    master = free_port()
    extra = {"FRNCCL_DUMP_DIR": str(tmp_path / "dumps"), "FRNCCL_METRICS_INTERVAL_SEC": "0.2", **env}
    job = JobThread(lambda: run_commands([[sys.executable, str(WORKER), str(state)]] * world,
                                         [_env(r, world, master, extra) for r in range(world)], timeout=150))
    return job, state


def lines_with(job: Any, text: str) -> list[str]:
    return [ln for r in job.ranks for ln in r.output.splitlines() if text in ln]


def test_one_endpoint_serves_every_rank_of_the_host_and_shows_the_slow_one(tmp_path):
    port = free_port()
    # Rank 3 sleeps 0.25 s before each op; the watchdog's idle poll (10 ms here) bounds how precisely a
    # completion is seen, so the ranks that wait for rank 3 wait about 0.25 s longer than it does.
    job, state = start_job(tmp_path, 4, {"FRNCCL_METRICS_PORT": str(port), "SLOW_RANK": "3", "SLOW_S": "0.25",
                                         "FRNCCL_WATCHDOG_POLL_MS": "10"})
    seen: dict[str, list[Any]] = {}

    def progressed() -> bool:
        nonlocal seen
        seen = scrape(port)
        done = by_rank(seen.get("frnccl_last_completed_seq", []), kind="collective", pg_desc="default_pg")
        waits = by_rank(seen.get("frnccl_op_wait_median_seconds", []), pg_desc="default_pg")
        return len(done) == 4 and min(done.values()) >= 12 and len(waits) == 4

    try:
        wait_for(progressed, 120, "every rank's figures on the endpoint, 12 ops in", bg=job)
    finally:
        (state / "stop").write_text("1")
    finished = job.finish()
    finished.assert_ok()
    ranks = {int(s.labels["rank"]) for s in seen["frnccl_rank_info"]}
    assert ranks == {0, 1, 2, 3}, seen["frnccl_rank_info"]
    assert len({s.labels["pid"] for s in seen["frnccl_rank_info"]}) == 4
    done = by_rank(seen["frnccl_last_completed_seq"], kind="collective", pg_desc="default_pg")
    enqueued = by_rank(seen["frnccl_last_enqueued_seq"], kind="collective", pg_desc="default_pg")
    ops = by_rank(seen["frnccl_ops"], op="all_reduce", pg_desc="default_pg")
    for rank in range(4):
        assert enqueued[rank] - 1 <= done[rank] <= enqueued[rank], (rank, done, enqueued)
        assert ops[rank] == enqueued[rank], (rank, ops, enqueued)  # one all_reduce per seq
    waits = by_rank(seen["frnccl_op_wait_median_seconds"], pg_desc="default_pg")
    lateness = {rank: max(waits.values()) - w for rank, w in waits.items()}
    assert max(lateness, key=lateness.get) == 3, waits
    assert lateness[3] > 0.15, waits
    assert by_rank(seen["frnccl_incidents"], failure="true") == {0: 0, 1: 0, 2: 0, 3: 0}
    assert len(lines_with(finished, "frnccl: metrics: serving this host's ranks")) == 1, finished.describe()
    assert not list(_spool(port).glob("rank-*.prom")), "rank files left behind"


def test_a_port_taken_by_another_program_is_one_line_and_the_job_goes_on(tmp_path):
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("0.0.0.0", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        job, state = start_job(tmp_path, 2, {"FRNCCL_METRICS_PORT": str(port)})
        wait_for(lambda: (state / "running").exists(), 90, "the job's first op", bg=job)
        wait_for(lambda: any(p.name.startswith("rank-") for p in _spool(port).glob("*")), 30, "the ranks' metric files", bg=job)
        (state / "stop").write_text("1")
        finished = job.finish()
    finally:
        taken.close()
    finished.assert_ok()
    said = lines_with(finished, "frnccl: metrics:")
    assert len(said) == 1, finished.describe()
    assert f"cannot serve http://0.0.0.0:{port}/metrics" in said[0] and "the job goes on" in said[0], said
    assert [r["ops"] for r in finished.results()][0] >= 1


def _spool(port: int) -> Path:
    return _spool_root() / str(port)


@pytest.mark.parametrize("name,value,complaint", [
    ("FRNCCL_METRICS_PORT", "http", "FRNCCL_METRICS_PORT must be a port number from 1 to 65535, got 'http'"),
    ("FRNCCL_METRICS_PORT", "70000", "FRNCCL_METRICS_PORT must be a port number from 1 to 65535, got '70000'"),
    ("FRNCCL_METRICS_ADDR", "localhost:80", "FRNCCL_METRICS_ADDR must be a numeric IPv4 or IPv6 address, got 'localhost:80'"),
    ("FRNCCL_METRICS_INTERVAL_SEC", "0", "FRNCCL_METRICS_INTERVAL_SEC must be from 0.1 to 3600, got '0'"),
])
def test_a_bad_setting_is_one_line_and_the_job_goes_on(tmp_path, name, value, complaint):
    env = {"FRNCCL_METRICS_PORT": str(free_port()), name: value}
    job, state = start_job(tmp_path, 2, env)
    wait_for(lambda: (state / "running").exists(), 90, "the job's first op", bg=job)
    (state / "stop").write_text("1")
    finished = job.finish()
    finished.assert_ok()
    said = lines_with(finished, "frnccl: metrics:")
    assert len(said) == 2, finished.describe()  # one per rank: each read the setting
    assert all(complaint in ln and "no metrics; the job goes on" in ln for ln in said), said
    assert not any("Traceback" in r.output for r in finished.ranks)


def test_textfiles_for_node_exporter_hold_each_rank_and_go_with_it(tmp_path):
    folder = tmp_path / "textfiles"
    job, state = start_job(tmp_path, 2, {"FRNCCL_METRICS_DIR": str(folder)})
    files = [folder / "frnccl_rank0.prom", folder / "frnccl_rank1.prom"]

    def both_progressed() -> bool:
        for path in files:
            try:
                families = {f.name: f.samples for f in text_string_to_metric_families(path.read_text())}
            except (OSError, ValueError):
                return False
            done = [s.value for s in families.get("frnccl_last_completed_seq", []) if s.labels["kind"] == "collective"]
            if not done or done[0] < 3:
                return False
        return True

    try:
        wait_for(both_progressed, 90, "both ranks' textfiles, 3 ops in", bg=job)
    finally:
        (state / "stop").write_text("1")
    finished = job.finish()
    finished.assert_ok()
    assert not lines_with(finished, "frnccl: metrics:"), finished.describe()  # no port asked for, nothing said
    assert not [p for p in files if p.exists()], "a textfile outlived its rank"
    assert not list(folder.glob("*.prom.*")), list(folder.iterdir())  # no temporary file left


def test_another_rank_of_the_host_serves_once_the_serving_one_exits(tmp_path):
    """Two 1-rank jobs share a port: the first serves both; when it ends the second takes over."""
    port = free_port()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    first, first_state = start_job(tmp_path / "a", 1, {"FRNCCL_METRICS_PORT": str(port)})
    wait_for(lambda: "frnccl_rank_info" in scrape(port), 90, "the first job's endpoint", bg=first)
    second, second_state = start_job(tmp_path / "b", 1, {"FRNCCL_METRICS_PORT": str(port)})

    def pids() -> set[str]:
        return {s.labels["pid"] for s in scrape(port).get("frnccl_rank_info", [])}

    wait_for(lambda: len(pids()) == 2, 90, "both jobs' ranks on the one endpoint", bg=second)
    both = pids()
    (first_state / "stop").write_text("1")
    first_done = first.finish()
    first_done.assert_ok()
    wait_for(lambda: len(pids()) == 1, 60, "the second job's endpoint, alone", bg=second)
    assert pids() < both
    (second_state / "stop").write_text("1")
    finished = second.finish()
    finished.assert_ok()
    assert len(lines_with(finished, "frnccl: metrics: serving")) == 1, finished.describe()
    for job in (first_done, finished):  # the handover is quiet: the new holder waits for the port to come free
        assert not lines_with(job, "cannot serve"), job.describe()


def test_a_spool_folder_others_can_write_is_refused(tmp_path):
    port = free_port()
    spool = _spool(port)
    spool.mkdir(parents=True, mode=0o700, exist_ok=True)
    os.chmod(spool, 0o777)
    textfile = tmp_path / "textfiles" / "frnccl_rank0.prom"
    try:
        # The textfile shows when the exporter has set up: by then it has refused the spool folder.
        job, state = start_job(tmp_path, 1, {"FRNCCL_METRICS_PORT": str(port), "FRNCCL_METRICS_DIR": str(textfile.parent)})
        wait_for(textfile.exists, 90, "the rank's textfile", bg=job)
        served = scrape(port)
        planted = sorted(p.name for p in spool.iterdir())
        (state / "stop").write_text("1")
        finished = job.finish()
    finally:
        os.rmdir(spool)
    finished.assert_ok()
    said = lines_with(finished, "frnccl: metrics:")
    assert len(said) == 1 and "can be written by others (mode 777)" in said[0] and "the job goes on" in said[0], said
    assert served == {} and planted == [], (served, planted)  # nothing served, nothing written there


def test_hostile_files_in_the_spool_folder_are_left_out(tmp_path):
    """Files the endpoint must not serve: a link, garbage, an oversized file, a name of another shape."""
    port = free_port()
    spool = _spool(port)
    spool.mkdir(parents=True, mode=0o700, exist_ok=True)
    me = os.getpid()  # alive: its files are not swept away as a gone rank's
    (spool / f"rank-5-{me}.prom").symlink_to("/etc/hostname")
    (spool / f"rank-6-{me}.prom").write_bytes(b"frnccl_rank_info{rank=\"6\" 1\n\xff\xfe garbage {{{\n")
    (spool / f"rank-7-{me}.prom").write_bytes(b"# HELP frnccl_x y\n" + b"x" * (5 << 20))
    (spool / "rank-8.prom").write_text('frnccl_rank_info{job_id="j",rank="8"} 1\n')
    job, state = start_job(tmp_path, 2, {"FRNCCL_METRICS_PORT": str(port)})
    seen: dict[str, list[Any]] = {}

    def both_served() -> bool:
        nonlocal seen
        seen = scrape(port)
        return len(seen.get("frnccl_rank_info", [])) >= 2

    try:
        wait_for(both_served, 90, "the job's two ranks on the endpoint", bg=job)
    finally:
        (state / "stop").write_text("1")
    finished = job.finish()
    finished.assert_ok()
    assert sorted(int(s.labels["rank"]) for s in seen["frnccl_rank_info"]) == [0, 1], seen["frnccl_rank_info"]
    assert not lines_with(finished, "frnccl: metrics: refresh failed"), finished.describe()


def test_a_stalled_group_shows_while_it_waits(tmp_path):
    port = free_port()
    job, state = start_job(tmp_path, 2, {"FRNCCL_METRICS_PORT": str(port), "STALL_RANK": "1", "STALL_AT": "5"})
    stalled: dict[int, float] = {}

    def rank0_stalled() -> bool:
        nonlocal stalled
        stalled = by_rank(scrape(port).get("frnccl_stalled_seconds", []), pg_desc="default_pg")
        return stalled.get(0, 0.0) >= 1.0

    try:
        wait_for(rank0_stalled, 90, "rank 0's group stalled a second", bg=job)
        done = by_rank(scrape(port).get("frnccl_last_completed_seq", []), kind="collective", pg_desc="default_pg")
    finally:
        (state / "unstall").write_text("1")
        (state / "stop").write_text("1")
    finished = job.finish()
    finished.assert_ok()
    assert done.get(0) == 4, done  # rank 0 waits in its 5th op, the 4th its last completed
    assert stalled.get(1, 0.0) < 1.0, stalled  # rank 1 has no op pending: it is the one that stalls the group


def test_a_forked_child_that_exits_leaves_the_serving_rank_as_it_was(tmp_path):
    """The serving rank forks a child (as a DataLoader worker) that exits normally: the child's exit must neither
    hang on the parent's server nor remove the parent's files. Refreshes 30 s apart: a removed file stays gone."""
    port = free_port()
    job, state = start_job(tmp_path, 1, {"FRNCCL_METRICS_PORT": str(port), "FRNCCL_METRICS_INTERVAL_SEC": "30",
                                         "FORK_CHILD": "1"})
    try:
        wait_for(lambda: "frnccl_rank_info" in scrape(port), 90, "the rank serving", bg=job)
        (state / "fork_now").write_text("1")
        wait_for(lambda: (state / "running").exists(), 60, "the child to have exited", bg=job)
        files = sorted(p.name for p in _spool(port).glob("rank-*.prom"))
        served = scrape(port)
    finally:
        (state / "stop").write_text("1")
    finished = job.finish()
    finished.assert_ok()
    exited = [ln.split() for ln in finished.ranks[0].output.splitlines() if ln.startswith("CHILD_EXITED ")]
    assert len(exited) == 1 and exited[0][1] == "0" and float(exited[0][2]) < 10, finished.describe()
    assert len(files) == 1 and files[0].startswith("rank-0-"), files
    assert "frnccl_rank_info" in served, "the endpoint went with the child"
