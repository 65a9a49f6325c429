"""FRNCCL_ENABLE=1 on real NCCL: an unmodified script that says "nccl" runs on frnccl, sees the names it sees
without it, gives the same results, and leaves a job-wide dump with its ops."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dist_harness import run_ranks  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def _outs(job) -> list[str]:
    job.assert_ok()
    return sorted(ln for r in job.ranks for ln in r.output.splitlines() if ln.startswith("OUT "))


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA device")
@pytest.mark.timeout(600)
def test_enable_on_nccl_same_as_plain_and_dumped(tmp_path):
    world = min(GPUS, 2)
    dumps = tmp_path / "dumps"
    plain = _outs(run_ranks("gpu_enable.py", world, timeout=240, env={"FRNCCL_DUMP_DIR": str(dumps)}))
    assert not dumps.exists(), "the plain run must not be frnccl's"
    enabled = _outs(run_ranks("gpu_enable.py", world, "--dump", timeout=240,
                              env={"FRNCCL_ENABLE": "1", "FRNCCL_DUMP_DIR": str(dumps)}))
    assert enabled == plain
    assert any("get_backend=nccl" in ln for ln in plain), plain
    from fr_backend import load_dump

    files = sorted(dumps.rglob("frnccl_rank_*"))
    assert len({f.name.split(".")[0] for f in files}) == world, files
    for f in files:
        dump = load_dump(str(f))
        names = [str(e.get("profiling_name", "")) for e in dump["entries"]]
        assert any(n.endswith("all_reduce") for n in names), names
        assert any(n.endswith("broadcast") for n in names), names
        backends = {str(c.get("backend")) for c in dump["pg_config"].values()}
        assert any("nccl" in b for b in backends), backends
