"""frnccl's metrics as a real Prometheus server sees them: it scrapes a running 4-rank job's host endpoint,
and the PromQL queries that docs/usage.md shows answer over its HTTP API: every rank's progress, and the
rank the others wait for. Needs Debian's `prometheus` package (CI installs it as root); skips without it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from dist_harness import free_port, wait_for
from test_metrics import _spool_cleanup, lines_with, start_job  # noqa: F401 (autouse fixture)

pytest.importorskip("prometheus_client", reason="prometheus_client is not installed (scripts/install.sh --test)")
PROMETHEUS = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus server (Debian: apt-get install prometheus; CI installs it as root)"),
]
USAGE = Path(__file__).parents[1] / "docs" / "usage.md"


def documented_queries() -> dict[str, str]:
    """The PromQL of docs/usage.md's metrics section: lines `<!-- query NAME -->` followed by a ```promql block."""
    text = USAGE.read_text()
    found = dict(re.findall(r"<!-- query (\w+) -->\s*```promql\n(.*?)\n```", text, flags=re.S))
    assert set(found) >= {"progress", "slowest_rank", "stalled_group", "since_progress", "each_rank_lateness"}, found
    return found


def query(port: int, promql: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            answer = json.load(response)
    except OSError:
        return []
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_prometheus_scrapes_a_running_job_and_finds_its_slow_rank(tmp_path):
    queries = documented_queries()
    metrics_port, prom_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: frnccl\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n"
    )
    prom_log = (tmp_path / "prometheus.log").open("w")
    server = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=prom_log, stderr=subprocess.STDOUT, start_new_session=True)
    job, state = start_job(tmp_path, 4, {"FRNCCL_METRICS_PORT": str(metrics_port), "FRNCCL_METRICS_ADDR": "127.0.0.1",
                                         "SLOW_RANK": "2", "SLOW_S": "0.25", "FRNCCL_WATCHDOG_POLL_MS": "10",
                                         "FRNCCL_SLOW_DETECT": "1", "FRNCCL_SLOW_WINDOW_SEC": "2"})
    try:
        progress: list[dict[str, Any]] = []

        def every_rank_progressed() -> bool:
            nonlocal progress
            progress = query(prom_port, queries["progress"])
            return len(progress) == 4 and all(float(r["value"][1]) >= 12 for r in progress)

        wait_for(every_rank_progressed, 150, "Prometheus to hold every rank's progress, 12 ops in", bg=job, poll_s=0.5)
        slowest: list[dict[str, Any]] = []

        def slowest_known() -> bool:
            nonlocal slowest
            slowest = query(prom_port, queries["slowest_rank"])
            return len(slowest) == 1 and float(slowest[0]["value"][1]) > 0.15

        wait_for(slowest_known, 60, "the slowest-rank query to name a rank 0.15 s late", bg=job, poll_s=0.5)
        lateness: list[dict[str, Any]] = []

        def every_rank_lateness() -> bool:
            nonlocal lateness
            lateness = [r for r in query(prom_port, queries["each_rank_lateness"]) if r["metric"]["pg_desc"] == "default_pg"]
            return len(lateness) == 4 and max(float(r["value"][1]) for r in lateness) > 0.15

        wait_for(every_rank_lateness, 60, "every rank's lateness from the detector's windows, one 0.15 s late", bg=job, poll_s=0.5)
        stalled = query(prom_port, queries["stalled_group"])
        since = query(prom_port, queries["since_progress"])
    finally:
        (state / "stop").write_text("1")
        try:
            finished = job.finish()
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
            prom_log.close()
    finished.assert_ok()
    assert sorted(int(r["metric"]["rank"]) for r in progress) == [0, 1, 2, 3], progress
    assert slowest[0]["metric"]["rank"] == "2", slowest
    late = {int(r["metric"]["rank"]): float(r["value"][1]) for r in lateness}
    assert sorted(late) == [0, 1, 2, 3] and late[2] > 0.15, lateness
    assert all(abs(v) < 0.1 for r, v in late.items() if r != 2), lateness  # the ranks on time: about 0
    assert stalled == [], stalled  # a slow job is not a stalled one
    assert sorted(int(r["metric"]["rank"]) for r in since) == [0, 1, 2, 3], since
    assert all(float(r["value"][1]) < 30 for r in since), since
    assert len(lines_with(finished, "frnccl: metrics: serving")) == 1, finished.describe()
