"""SIGTERM with a frnccl group alive (FRNCCL_DUMP_ON_TERMINATE_MS): the rank writes its dump, then the signal does
what it would have done without frnccl: the default action ends the process by SIGTERM, or the program's own
handler runs and the job goes on. 2 plain ranks (workers/terminate.py); the test sends rank 1 SIGTERM."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import fr_backend
from dist_harness import Job, JobThread, run_ranks, wait_for

DUMP_TIMEOUT_S = 3


def sigterm_rank_1(tmp_path: Path, mode: str, **env: str) -> tuple[Job, float]:
    state = tmp_path / "state"
    state.mkdir()
    job_env = {"FRNCCL_DUMP_DIR": str(tmp_path / "dumps"), "FRNCCL_DUMP_TIMEOUT_SEC": str(DUMP_TIMEOUT_S), **env}
    bg = JobThread(lambda: run_ranks("terminate.py", 2, mode, str(state), timeout=90, env=job_env))
    wait_for(lambda: (state / "running").exists() and (state / "pid_1").exists(), 60, "the job to run", bg)
    os.kill(int((state / "pid_1").read_text()), signal.SIGTERM)
    sent = time.monotonic()
    job = bg.finish(120)
    assert not job.timed_out, job.describe()
    return job, sent


def sigterm_dumps(tmp_path: Path) -> list[dict]:
    return [fr_backend.load_dump(str(p)) for p in sorted((tmp_path / "dumps").glob("*/compact/frnccl_rank_1.json.gz"))
            if fr_backend.load_dump(str(p))["dump_reason"] == "sigterm"]


def check_sigterm_dump(tmp_path: Path, log: str) -> None:
    dumps = sigterm_dumps(tmp_path)
    assert len(dumps) == 1, f"rank 1 must have written one dump on SIGTERM\n{log}"
    d = dumps[0]
    assert d["incident_id"].endswith("-sigterm-r1") and d["trigger_rank"] == 1, d["incident_id"]
    # This process sent it, and started the ranks: the dump names it as the rank's parent, its launcher.
    assert d["dump_detail"] == f"SIGTERM from pid {os.getpid()} (this process's parent: its launcher)", d["dump_detail"]
    assert d["stacks_symbolized"] is False and d["entries"], d["stacks_symbolized"]


def test_sigterm_dumps_then_ends_the_process(tmp_path):
    job, sent = sigterm_rank_1(tmp_path, "default")
    log = job.describe()
    assert job.ranks[1].returncode == -signal.SIGTERM, f"the default action must still end the rank\n{log}"
    assert job.ranks[1].exited_mono is not None and job.ranks[1].exited_mono - sent < 10, log
    assert "writing this rank's dump" in job.ranks[1].output, log
    check_sigterm_dump(tmp_path, log)


def test_sigterm_reaches_the_programs_own_handler_after_the_dump(tmp_path):
    job, _ = sigterm_rank_1(tmp_path, "handler")
    log = job.describe()
    job.assert_ok()  # the program handled SIGTERM itself and ended both ranks normally
    assert "HANDLED 1" in job.ranks[1].output and "DONE 1" in job.ranks[1].output, log
    check_sigterm_dump(tmp_path, log)


def test_sigterm_dump_off(tmp_path):
    job, _ = sigterm_rank_1(tmp_path, "default", FRNCCL_DUMP_ON_TERMINATE_MS="0")
    log = job.describe()
    assert job.ranks[1].returncode == -signal.SIGTERM, log
    assert sigterm_dumps(tmp_path) == [], log
    assert "writing this rank's dump" not in job.ranks[1].output, log


@pytest.mark.parametrize("raw", ["-1", "abc", "60001"])
def test_bad_terminate_dump_setting(raw):
    with pytest.raises(fr_backend.config.ConfigError, match="^FRNCCL_DUMP_ON_TERMINATE_MS"):
        fr_backend.config.FrConfig.from_env({"FRNCCL_DUMP_ON_TERMINATE_MS": raw})
