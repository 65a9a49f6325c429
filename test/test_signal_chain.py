"""frnccl's dump signal (SIGUSR1) and the handlers programs install for it (workers/signal_chain.py).

Slurm's --signal, Lightning's auto-requeue and many scripts handle SIGUSR1 themselves, before or after their
process group exists. With frnccl on, that signal asks the job to dump, and the program's own handler must
run as well; a process with no frnccl group (yet, or at all) must never be ended by it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

import fr_backend
from dist_harness import JobThread, run_ranks, wait_for

JOB_TIMEOUT_S = 120
NO_GROUP_LINE = ("frnccl: signal 10 (User defined signal 1, FRNCCL_DUMP_SIGNAL) reached a process with no frnccl "
                 "group alive: nothing to dump; frnccl kept it from ending the process")


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRNCCL_")}
    env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="1", FRNCCL_ENABLE="1", FRNCCL_DUMP_DIR=str(tmp_path / "dumps"),
               FRNCCL_DUMP_TIMEOUT_SEC="20")
    return env


def _signal_dumps(tmp_path: Path, world: int) -> list[dict] | None:
    files = [sorted((tmp_path / "dumps").glob(f"*/compact/frnccl_rank_{r}.json.gz")) for r in range(world)]
    if not all(files):
        return None
    return [fr_backend.load_dump(str(f[-1])) for f in files]


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_dump_signal_before_any_group_leaves_the_process_running(tmp_path: Path) -> None:
    job = run_ranks("signal_chain.py", 1, "no_group", str(tmp_path), timeout=JOB_TIMEOUT_S, env=_env(tmp_path))
    log = job.describe()
    assert job.ranks[0].returncode == 0 and "DONE 0" in job.ranks[0].output, log
    lines = [ln for ln in job.ranks[0].output.splitlines() if "no frnccl group alive" in ln]
    assert lines == [NO_GROUP_LINE], log
    assert not list(tmp_path.rglob("*.json.gz")), log


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
@pytest.mark.parametrize("mode", ["handler_before", "handler_after"])
def test_dump_signal_reaches_the_programs_own_handler_too(tmp_path: Path, mode: str) -> None:
    state = tmp_path / "state"
    state.mkdir()
    bg = JobThread(lambda: run_ranks("signal_chain.py", 2, mode, str(state), timeout=JOB_TIMEOUT_S,
                                     env=_env(tmp_path)))
    try:
        wait_for(lambda: all((state / f"pid_{r}").exists() for r in range(2)), 60, "both ranks to run", bg)
        os.kill(int((state / "pid_1").read_text()), signal.SIGUSR1)
        wait_for(lambda: (state / "handled_1").exists(), 30, "the program's own SIGUSR1 handler", bg)
        wait_for(lambda: _signal_dumps(tmp_path, 2) is not None, 30, "both ranks' dumps", bg)
    finally:
        (state / "stop").write_text("1")
    job = bg.finish(JOB_TIMEOUT_S)
    log = job.describe()
    job.assert_ok()
    dumps = _signal_dumps(tmp_path, 2)
    assert dumps is not None and [d["dump_reason"] for d in dumps] == ["signal", "signal"], log
    assert not (state / "handled_0").exists(), log  # the signal went to rank 1 only; the job-wide dump is frnccl's


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_abort_behind_a_handler_that_hands_back_to_frnccl_ends_the_process(tmp_path: Path) -> None:
    """faulthandler installs itself in front of frnccl's SIGABRT handler and, on the signal, puts frnccl's back
    and raises it again. A later signal.signal call (of any signal) must not put frnccl's in front of
    faulthandler's: the two would hand the signal to each other forever."""
    job = run_ranks("signal_chain.py", 1, "faulthandler_abort", str(tmp_path), timeout=60, env=_env(tmp_path))
    log = job.describe()
    assert not job.timed_out and job.ranks[0].returncode == -signal.SIGABRT, log
    assert job.ranks[0].output.count("Fatal Python error: Aborted") == 1, log[:4000]


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_programs_handler_runs_while_the_main_thread_is_blocked(tmp_path: Path) -> None:
    """Python runs a handler while its main thread is blocked in a system call only if the signal interrupts
    that call (EINTR): frnccl's handler in front of Python's must interrupt it as Python's would."""
    bg = JobThread(lambda: run_ranks("signal_chain.py", 1, "blocked_read", str(tmp_path), timeout=JOB_TIMEOUT_S,
                                     env=_env(tmp_path)))
    wait_for(lambda: (tmp_path / "pid_0").exists(), 60, "the main thread to block", bg)
    os.kill(int((tmp_path / "pid_0").read_text()), signal.SIGTERM)
    wait_for(lambda: (tmp_path / "handled_0").exists(), 10, "the program's SIGTERM handler, during the read", bg)
    job = bg.finish(JOB_TIMEOUT_S)
    assert job.ranks[0].returncode == 0 and "DONE 0" in job.ranks[0].output, job.describe()


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_dump_signal_in_a_forked_child_says_so_and_leaves_it_running(tmp_path: Path) -> None:
    job = run_ranks("signal_chain.py", 1, "fork_usr1", str(tmp_path), timeout=JOB_TIMEOUT_S, env=_env(tmp_path))
    log = job.describe()
    assert job.ranks[0].returncode == 0 and "CHILD 0" in job.ranks[0].output, log
    assert NO_GROUP_LINE in job.ranks[0].output, log


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_an_ignored_dump_signal_stays_ignored(tmp_path: Path) -> None:
    job = run_ranks("signal_chain.py", 1, "ignored_usr1", str(tmp_path), timeout=JOB_TIMEOUT_S, env=_env(tmp_path))
    log = job.describe()
    assert job.ranks[0].returncode == 0 and "DONE 0" in job.ranks[0].output, log
    assert "no frnccl group alive" not in log and not list(tmp_path.rglob("*.json.gz")), log
