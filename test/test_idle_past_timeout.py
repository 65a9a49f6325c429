"""A healthy job never times out: every op of the frnccl backend, issued and waited, then idle past its group's
timeout, gives no incident and shows as completed in the dump.

Some inner Works never report completion, even after wait() (Gloo's reduce_scatter family on torch 2.11-2.13,
which tensor and sequence parallelism issue on every step): such an op used to time out a healthy job.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from dist_harness import run_ranks

TIMEOUT_S = 3
WORKER = "idle_past_timeout.py"


def _ops() -> list[str]:
    # The worker's tables of ops, read without importing it (it needs a process group).
    import ast

    tree = ast.parse((Path(__file__).parent / "workers" / WORKER).read_text())
    names = [k.value for node in tree.body  # type: ignore[union-attr]
             if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") in ("OPS", "LATE_WAITS")
             for k in node.value.keys]
    assert len(names) > 20, "the worker's tables of ops were not found"
    return names


OPS = _ops()


@pytest.fixture(scope="module")
def idle_job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    dump_dir = tmp_path_factory.mktemp("idle_dumps")
    job = run_ranks(WORKER, 2, str(TIMEOUT_S), timeout=240,
                    env={"FRNCCL_DUMP_DIR": str(dump_dir), "FRNCCL_DUMP_TIMEOUT_SEC": "5"})
    assert not job.timed_out, job.describe()
    # Each op's test reads its own verdict from the results; the job-wide one is checked below.
    return {"results": job.results(), "dump_dir": dump_dir, "job": job}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("op", OPS)
def test_op_idle_past_timeout(idle_job: dict[str, Any], op: str) -> None:
    for r in idle_job["results"]:
        if op in r["unsupported"]:
            pytest.skip(f"this torch's Gloo refuses it: {r['unsupported'][op]}")
        assert op not in r["errors"], (r["rank"], r["errors"][op])
        states = r["states"].get(op)
        assert states, f"rank {r['rank']}: no entry of group {op!r} in the dump"
        assert set(states) == {"completed"}, (r["rank"], op, states)
        assert op not in r["after"], f"rank {r['rank']}: group {op!r} unusable after idling: {r['after'][op]}"


@pytest.mark.timeout(300)
def test_idle_job_has_no_incident(idle_job: dict[str, Any]) -> None:
    """The job ran to its end with only the manual dump written, and no rank logged a timeout."""
    job = idle_job["job"]
    assert all(r.returncode == 0 for r in job.ranks), job.describe()
    for r in idle_job["results"]:
        assert not r["after"], (r["rank"], r["after"])
    folders = sorted(p.name for p in Path(idle_job["dump_dir"]).iterdir() if p.is_dir())
    manual = {Path(r["dump_folder"]).name for r in idle_job["results"]}
    assert set(folders) == manual, folders
    assert all("timeout on" not in r.output for r in job.ranks), job.describe()
