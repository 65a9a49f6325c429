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


@pytest.mark.parametrize("mode", ["handler", "handler_after"])
def test_sigterm_reaches_the_programs_own_handler_after_the_dump(tmp_path, mode):
    """The program's handler, installed before the first group or after it (Lightning's, when fit starts): the
    dump is written, and the program's handler still runs."""
    job, _ = sigterm_rank_1(tmp_path, mode)
    log = job.describe()
    job.assert_ok()  # the program handled SIGTERM itself and ended both ranks normally
    assert "HANDLED 1" in job.ranks[1].output and "DONE 1" in job.ranks[1].output, log
    check_sigterm_dump(tmp_path, log)


def test_every_sigterm_the_program_survives_dumps(tmp_path):
    """A program whose own handler takes SIGTERM and goes on (Lightning's): each SIGTERM writes a dump, not only
    the first of the process's life."""
    state = tmp_path / "state"
    state.mkdir()
    job_env = {"FRNCCL_DUMP_DIR": str(tmp_path / "dumps"), "FRNCCL_DUMP_TIMEOUT_SEC": str(DUMP_TIMEOUT_S)}
    bg = JobThread(lambda: run_ranks("terminate.py", 2, "survives", str(state), timeout=90, env=job_env))
    try:
        wait_for(lambda: (state / "running").exists() and (state / "pid_1").exists(), 60, "the job to run", bg)
        for n in (1, 2):
            os.kill(int((state / "pid_1").read_text()), signal.SIGTERM)
            wait_for(lambda: (state / f"handled_1_{n}").exists() and len(sigterm_dumps(tmp_path)) == n, 30,
                     f"SIGTERM {n}: the program's handler and rank 1's dump", bg)
    finally:
        (state / "stop").write_text("1")
    job = bg.finish(120).assert_ok()
    assert len({d["incident_id"] for d in sigterm_dumps(tmp_path)}) == 2, job.describe()


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


def main_thread_sleeps_holding_gil(pid: int) -> bool:
    """The rank's main thread is inside libc sleep() (workers/terminate.py `gil`), which it entered holding the GIL."""
    task = Path(f"/proc/{pid}/task/{pid}")
    try:
        wchan = (task / "wchan").read_text().strip()
        state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    # A kernel that hides wchan shows "0": sleeping is then the best sign there is.
    return "nanosleep" in wchan if wchan not in ("", "0") else state == "S"


def thread_names(pid: int) -> list[str]:
    names = []
    for comm in Path(f"/proc/{pid}/task").glob("*/comm"):
        try:
            names.append(comm.read_text().strip())
        except OSError:
            pass  # the thread ended meanwhile
    return names


def test_sigterm_cuts_short_a_dump_waiting_for_the_gil(tmp_path):
    """Each rank's main thread holds the GIL in a C call; the dump signal opens an incident, and each rank's dump
    waits for the GIL to symbolize (bounded far beyond the SIGTERM window); then SIGTERM reaches every rank, whose
    part is already being written, so the signal's dump leaves it to the monitor. The wait for the GIL must end
    then: the part is written unsymbolized before the process ends, not lost with it."""
    state = tmp_path / "state"
    state.mkdir()
    dump_dir = tmp_path / "dumps"
    job_env = {"FRNCCL_DUMP_DIR": str(dump_dir), "FRNCCL_DUMP_TIMEOUT_SEC": "60",
               "FRNCCL_SYMBOLIZE_TIMEOUT_MS": "600000", "FRNCCL_DUMP_ON_TERMINATE_MS": "20000"}
    bg = JobThread(lambda: run_ranks("terminate.py", 2, "gil", str(state), timeout=120, env=job_env))
    wait_for(lambda: (state / "pid_0").exists() and (state / "pid_1").exists(), 60, "both ranks to run", bg)
    pids = [int((state / f"pid_{r}").read_text()) for r in range(2)]
    wait_for(lambda: all(main_thread_sleeps_holding_gil(p) for p in pids), 60, "both main threads to hold the GIL", bg)
    os.kill(pids[1], signal.SIGUSR1)
    # Each rank's dump is in flight once its frnccl-gil thread waits for the GIL.
    wait_for(lambda: all("frnccl-gil" in thread_names(p) for p in pids), 60, "both ranks' dumps to wait for the GIL",
             bg)
    for p in pids:
        os.kill(p, signal.SIGTERM)
    job = bg.finish(150)
    log = job.describe()
    assert not job.timed_out, log
    for r in range(2):
        assert job.ranks[r].returncode == -signal.SIGTERM, f"the default action must still end rank {r}\n{log}"
        assert "not dumping again" in job.ranks[r].output, f"rank {r}'s part was in flight at SIGTERM\n{log}"
    parts = sorted(dump_dir.glob("*/compact/frnccl_rank_*.json.gz"))
    dumps = [fr_backend.load_dump(str(p)) for p in parts]
    assert sorted(d["rank"] for d in dumps) == [0, 1], f"each rank's part must be written\n{parts}\n{log}"
    assert len({d["incident_id"] for d in dumps}) == 1, [d["incident_id"] for d in dumps]
    for d in dumps:
        assert d["dump_reason"] == "signal" and d["entries"], (d["dump_reason"], len(d["entries"]))
        assert d["stacks_symbolized"] is False, d["rank"]
        # Read without the GIL: the main thread shows in the call that holds it.
        assert "terminate.py" in d["thread_stacks"] and "in main" in d["thread_stacks"], d["thread_stacks"]
