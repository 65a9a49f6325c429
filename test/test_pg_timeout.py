"""A group's timeout changed after its creation, as torchtitan's set_pg_timeouts does on every DeviceMesh group
and the default group, holds on frnccl groups as on gloo's (workers/stack_pg_timeout.py): the rank that waits
for a stalled peer fails after the new timeout, and torch gives no warning that frnccl groups cannot take it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch.distributed as dist

from dist_harness import Job, run_ranks

NEW_TIMEOUT_S = 3.0
# frnccl fails the waiting call once the job-wide dump is written: well under a second on 4 idle ranks, a few on
# a loaded machine. The stalled rank gives up after 60 s, so a timeout left at its creation value (120 s) fails
# the rank after about 60 s.
DUMP_MARGIN_S = 15.0
JOB_TIMEOUT_S = 150


def _env(mode: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRNCCL_")}
    env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="1", FRNCCL_DUMP_DIR=str(tmp_path / "dumps"))
    if mode == "enable":
        env["FRNCCL_ENABLE"] = "1"
    return env


def _outs(job: Job, rank: int) -> dict[str, str]:
    lines = [ln.split(" ", 2)[2] for ln in job.ranks[rank].output.splitlines() if ln.startswith(f"OUT {rank} ")]
    return dict(line.split("=", 1) for line in lines)


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
@pytest.mark.parametrize("mode,setter", [("plain", "_set_pg_timeout"), ("enable", "_set_pg_timeout"),
                                         ("frnccl", "_set_pg_timeout"), ("enable", "set_timeout")])
def test_timeout_set_after_creation_ends_the_wait(tmp_path: Path, mode: str, setter: str) -> None:
    if setter == "set_timeout" and not hasattr(dist, "set_timeout"):
        pytest.skip("this torch has no dist.set_timeout (it came with torch 2.15)")
    state = tmp_path / "state"
    state.mkdir()
    backend = "frnccl" if mode == "frnccl" else "gloo"
    job = run_ranks("stack_pg_timeout.py", 4, backend, setter, str(NEW_TIMEOUT_S), str(state),
                    timeout=JOB_TIMEOUT_S, env=_env(mode, tmp_path))
    assert not job.timed_out and all(r.returncode == 0 for r in job.ranks), job.describe()
    outs = [_outs(job, r) for r in range(4)]
    assert [o.get("timeout_warnings") for o in outs] == ["0"] * 4, job.describe()
    waiter = outs[0]
    assert waiter["tp_all_reduce"].startswith("raised"), job.describe()
    waited = float(waiter["tp_wait_s"])
    assert NEW_TIMEOUT_S - 0.5 <= waited <= NEW_TIMEOUT_S + DUMP_MARGIN_S, job.describe()
    assert outs[1]["stalled_until_rank0_done"] == "True", job.describe()
    assert [outs[r]["tp_all_reduce"] for r in (2, 3)] == ["completed"] * 2, job.describe()
    if mode != "plain":
        assert "verdict" in job.ranks[0].output, job.describe()
