"""The watchdog never breaks a CUDA graph capture of the training thread.

Needs 2 GPUs; skipped otherwise. Run on the GPU machine by scripts/gpu_check.sh.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dist_harness import run_ranks  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA devices")
def test_graph_capture_while_an_op_is_in_flight(tmp_path):
    job = run_ranks("gpu_graph_capture.py", 2, timeout=180, env={"FRNCCL_DUMP_DIR": str(tmp_path / "dumps")})
    job.assert_ok()
    results = {r["rank"]: r for r in job.results()}
    assert not results[0]["failures"], (results[0]["failures"], results[0]["notes"])
    assert {"capture_with_frnccl_op_in_flight", "not_completed_before_peer_joined"} <= set(results[0]["matched"])
    print("rank 0 notes:", results[0]["notes"])
