"""torch 2.15's own flight recorder on gloo groups, read by the analyzer: real dumps of a plain gloo job.

torch 2.15 leaves every entry 'scheduled', counts a failed op as completed in pg_status, and writes one
group under the empty name in pg_config with the wrong members. The analyzer must judge from what the ranks
issued and never name a rank on a state that the others' dumps contradict. Skipped on torch < 2.15 (the
CI leg on the newest torch runs it: .ci/newest_torch_tests.txt); the same shapes in torch 2.15's layout,
synthetic, run on every torch in test/analyzer/test_torch215_states.py.
"""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from torch.torch_version import TorchVersion

from dist_harness import run_ranks

from fr_backend.analyzer.load import guard_address_space
from fr_backend.analyzer.report import run

pytestmark = pytest.mark.skipif(TorchVersion(torch.__version__) < "2.15.0.dev0",
                                reason="torch's hook-era recorder and _dump_fr_trace_file(rank) are torch 2.15's")

GLOO_TIMEOUT_S = 10  # the faulty step's ops end on it; the good steps take milliseconds
CULPRIT = {"skip": 3, "hang": 1, "size": 3}  # test/workers/torch215_recorder.py


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shape", ["skip", "hang", "size"])
def test_torch215_gloo_recorder_dumps_name_the_culprit_only(tmp_path, shape):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    job = run_ranks("torch215_recorder.py", 4, shape, str(GLOO_TIMEOUT_S), timeout=200,
                    env={"TORCH_FR_DUMP_TEMP_FILE": str(dumps / "nccl_trace_rank_")})
    assert not job.timed_out, job.describe()
    dumped = sorted(int(n.rsplit("_", 1)[1]) for n in os.listdir(dumps))
    # gloo may end a size mismatch's receiving rank outright (it leaves no dump); every other rank dumps
    assert set(dumped) >= set(range(4)) - ({2} if shape == "size" else set()), job.describe()
    for r in dumped:
        with open(dumps / f"nccl_trace_rank_{r}", "rb") as f:
            d = pickle.load(f)
        assert "format" not in d and str(d["version"]).startswith("2."), d.get("version")  # torch's own dump
    guard_address_space(True)
    try:
        a = run([str(dumps)], jobs=1)
    finally:
        guard_address_space(False)
    faults = [f for f in a.findings if f.is_fault]
    named = {r for f in faults for r in f.culprit_ranks}
    if shape == "size" and 2 not in dumped:
        # Without rank 2's dump its sizes cannot be compared, nor is it known to be in pair {2,3} (torch's
        # pg_config does not say). Where pg_status claims rank 3's pair op completed, rank 3 is named (it never
        # issued the world op the others wait in); where not, rank 3 waits in its pair op and the finding is
        # that op (seq 6), naming no rank. Never an innocent rank.
        assert named <= {3} and faults and (named or faults[0].collective_seq_id == 6), (a.findings, a.res.notes,
                                                                                           job.describe())
    else:
        assert named == {CULPRIT[shape]}, (a.findings, a.res.notes, job.describe())
