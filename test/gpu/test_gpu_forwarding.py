"""CUDA tensors through frnccl (inner NCCL) give the same results as plain nccl.

One GPU per rank, from LOCAL_RANK; the comparisons with plain nccl need 2 GPUs, and skip otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dist_harness import run_ranks  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def failures_of(job) -> list[dict]:
    job.assert_ok()
    results = job.results()
    failures = [f"rank {r['rank']}: {f}" for r in results for f in r["failures"]]
    assert not failures, "frnccl differs from nccl:\n" + "\n".join(failures[:40])
    return results


def cases_matched(worker: str, tmp_path: Path) -> list[set[str]]:
    """Runs a 2-rank worker and returns, per rank, the cases whose checks held (failing on any that did not)."""
    job = run_ranks(worker, 2, timeout=120, env={"FRNCCL_DUMP_DIR": str(tmp_path / "dumps")})
    return [set(r["matched"]) for r in failures_of(job)]


@pytest.fixture(scope="module")
def collectives_job(tmp_path_factory):
    """One 2-rank job runs every case; the tests below read its results."""
    dumps = tmp_path_factory.mktemp("dumps")
    return run_ranks("gpu_collectives.py", 2, timeout=240, env={"FRNCCL_DUMP_DIR": str(dumps), "FRNCCL_TEST_PROGRESS": "1"})


@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA devices")
def test_gpu_collectives_match_nccl(collectives_job):
    results = failures_of(collectives_job)
    for r in results:
        names = set(r["matched"])
        for want in ["get_backend", "barrier", "objects", "all_reduce/RedOpType.SUM/float32/n=1000/async",
                     "all_gather_into_tensor/bfloat16/n=1048576/sync", "reduce_scatter_tensor/int64/n=1000/sync",
                     "all_to_all_single/uneven/float32/n=1000/sync", "isend_irecv/float32/n=1000",
                     "batch_isend_irecv/int64/n=1048576"]:
            assert want in names, (want, r["rank"])


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA device")
def test_cuda_tensor_without_nccl_is_a_clear_error(tmp_path):
    for matched in cases_matched("cuda_no_nccl.py", tmp_path):
        assert {"cuda_tensor_error", "cpu_still_works"} <= matched, matched


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA device")
def test_inner_nccl_timeout_keeps_its_backstop(tmp_path):
    """Changing the group's timeout keeps NCCL's own watchdog behind frnccl's timeout and dump, as at creation."""
    job = run_ranks("gpu_timeouts.py", min(GPUS, 2), timeout=120,
                    env={"FRNCCL_DUMP_DIR": str(tmp_path / "dumps"), "FRNCCL_DUMP_TIMEOUT_SEC": "11"})
    for result in failures_of(job):
        assert {"created", "changed", "all_reduce"} <= set(result["matched"]), result


@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA devices")
def test_barrier_of_a_bound_group_waits_for_gpu_work(tmp_path):
    for matched in cases_matched("gpu_bound_barrier.py", tmp_path):
        assert {"bound_barrier_waits_for_gpu_work", "frnccl_barrier_waited"} <= matched, matched
