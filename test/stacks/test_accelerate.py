"""Real Accelerate (accelerate from PyPI, `bash scripts/install_stacks.sh`) under torchrun, 2 CPU ranks, plain and
with FRNCCL_ENABLE=1 (stacks/accelerate_job.py): the same losses, and a rank stuck in its data loader named, in the
log and in torchrun's summary."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from dist_harness import Job, run_commands

pytest.importorskip("accelerate", reason="accelerate is not installed (bash scripts/install_stacks.sh)")

HERE = Path(__file__).resolve().parent
STEPS = 8
JOB_TIMEOUT_S = 150


def _torchrun(tmp_path: Path, enabled: bool, stall_rank: int) -> Job:
    tmp_path.mkdir(parents=True, exist_ok=True)
    drop = ("FRNCCL_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_",
            "MASTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="1", FRNCCL_DUMP_DIR=str(tmp_path / "dumps"), PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", FRNCCL_DUMP_TIMEOUT_SEC="10")
    if enabled:
        env["FRNCCL_ENABLE"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(HERE / "accelerate_job.py"), str(stall_rank), str(STEPS), str(tmp_path)]
    return run_commands([cmd], [env], JOB_TIMEOUT_S)


def _losses(tmp_path: Path) -> list[str]:
    return [(tmp_path / f"losses_{r}").read_text() for r in range(2) if (tmp_path / f"losses_{r}").exists()]


@pytest.mark.timeout(2 * JOB_TIMEOUT_S + 30)
def test_losses_match_plain(tmp_path: Path) -> None:
    plain = _torchrun(tmp_path / "plain", False, -1)
    enabled = _torchrun(tmp_path / "enabled", True, -1)
    for job in (plain, enabled):
        assert not job.timed_out and job.ranks[0].returncode == 0, job.describe()
    want = _losses(tmp_path / "plain")
    assert len(want) == 2 and all(len(text.splitlines()) == STEPS for text in want), plain.describe()
    assert _losses(tmp_path / "enabled") == want, f"plain:\n{plain.describe()}\nFRNCCL_ENABLE=1:\n{enabled.describe()}"


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
def test_rank_stuck_in_its_loader_is_named(tmp_path: Path) -> None:
    job = _torchrun(tmp_path, True, 1)
    log = job.describe()
    assert not job.timed_out and job.ranks[0].returncode != 0, log
    verdicts = [ln for ln in job.ranks[0].output.splitlines() if "frnccl: verdict:" in ln]
    assert verdicts and all("not_joined: rank 1 " in v for v in verdicts), log
    assert re.search(r"frnccl: rank 1 is at .*accelerate_job\.py:\d+ in load_next_batch", log), log
    # torchrun's summary names the same rank with the same words, whatever the timing (its error file, written
    # as torchrun stopped it, is stamped before the victim's).
    cause = re.search(r"Root Cause \(first observed failure\):\n(.*?)\n=+", job.ranks[0].output, re.S)
    assert cause, log
    assert re.search(r"^\s*rank\s*: 1 ", cause.group(1), re.M), log
    assert re.search(r"^\s*traceback\s*: frnccl: verdict: not_joined: rank 1 \(", cause.group(1), re.M), log
