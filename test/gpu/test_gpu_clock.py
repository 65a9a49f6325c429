"""Mapping GPU times onto the wall clock never holds up the watchdog (one GPU).

The watchdog renews its reference event now and then (docs/design.md, "GPU timing policy") and waits for
it only a bounded time, so that a GPU that does not run the event soon (its work queued behind stalled
work, or the device wedged) never stops the thread that detects hangs. Here the renewal falls while the GPU
runs a long kernel and a second stream waits for it, with one hardware queue per device
(CUDA_DEVICE_MAX_CONNECTIONS=1, common in large training jobs), and the op before it must still be seen
complete, with GPU times. On an H200 the reference event did not queue behind that wait (a version that
synchronized on it passed too), so this guards the behaviour rather than reproducing the stall.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dist_harness import run_ranks  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA device")
def test_reference_renewal_behind_a_busy_gpu_does_not_block_the_watchdog(tmp_path):
    job = run_ranks("gpu_incident.py", 1, timeout=120,
                    env={"SCENARIO": "clock_behind_busy_gpu", "FRNCCL_DUMP_DIR": str(tmp_path),
                         "FRNCCL_GPU_TIMING": "all", "CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    job.assert_ok()
    lines = [ln.split() for ln in job.ranks[0].output.splitlines() if ln.startswith("AFTER_BUSY_START ")]
    assert lines, job.describe()
    _, state, gpu_started_ns = lines[0]
    # Seen complete, with its GPU times mapped through the previous reference, while the GPU is still busy.
    assert state == "completed", job.describe()
    assert int(gpu_started_ns) > 0, job.describe()
