"""Real Lightning (pytorch-lightning from PyPI, `bash scripts/install.sh --stacks`), its own launcher, 2 CPU ranks,
FRNCCL_ENABLE=1 (stacks/lightning_job.py).

Lightning installs its SIGTERM handler with signal.signal when fit starts, after the process group exists. A
SIGTERM must still write frnccl's dump, and Lightning's handler must still run.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

import fr_backend
from dist_harness import JobThread, free_port, run_commands, wait_for

pytest.importorskip("pytorch_lightning", reason="pytorch-lightning is not installed (bash scripts/install_stacks.sh)")

HERE = Path(__file__).resolve().parent
JOB_TIMEOUT_S = 180


def _env(tmp_path: Path) -> dict[str, str]:
    # No RANK/LOCAL_RANK: Lightning's launcher starts the ranks itself.
    drop = ("FRNCCL_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="1", FRNCCL_ENABLE="1", FRNCCL_DUMP_DIR=str(tmp_path / "dumps"),
               FRNCCL_DUMP_TIMEOUT_SEC="10", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return env


def _sigterm_dump(tmp_path: Path, rank: int) -> dict | None:
    for path in sorted((tmp_path / "dumps").glob(f"*-sigterm-r{rank}/compact/frnccl_rank_{rank}.json.gz")):
        return fr_backend.load_dump(str(path))
    return None


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_sigterm_dumps_under_lightnings_own_handler(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    bg = JobThread(lambda: run_commands([[sys.executable, str(HERE / "lightning_job.py"), str(state)]],
                                        [_env(tmp_path)], JOB_TIMEOUT_S))
    try:
        wait_for(lambda: all((state / f"pid_{r}").exists() for r in range(2)), 120, "both ranks to train", bg)
        os.kill(int((state / "pid_1").read_text()), signal.SIGTERM)
        wait_for(lambda: _sigterm_dump(tmp_path, 1) is not None, 30, "rank 1's SIGTERM dump", bg)
    finally:
        (state / "stop").write_text("1")
        for r in range(2):  # what Lightning's handler does next (a broadcast only rank 1 joins) is Lightning's
            pid_file = state / f"pid_{r}"
            if pid_file.exists():
                try:
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)
                except ProcessLookupError:
                    pass
    job = bg.finish(JOB_TIMEOUT_S + 30)
    log = job.describe()
    dump = _sigterm_dump(tmp_path, 1)
    assert dump is not None and dump["dump_reason"] == "sigterm" and dump["entries"], log
    assert any("all_reduce" in str(e["profiling_name"]) for e in dump["entries"]), log  # DDP's gradient buckets
    assert f"[rank: 1] Received SIGTERM: {int(signal.SIGTERM)}" in job.ranks[0].output, \
        f"Lightning's own SIGTERM handler must still run on rank 1\n{log}"
