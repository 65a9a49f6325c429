"""torch's own distributed test suite, judging frnccl against gloo (scripts/peer_suite.py).

A subset of `DistributedTest._DistTestBase` (torch/testing/_internal/distributed/distributed_test.py)
that runs in about a minute per backend: collectives, p2p, barriers (one that times out on purpose),
monitored_barrier, DDP, object collectives, groups and the profiler's view of ops. Every test must pass
under both backends, so that a test that silently skips cannot pass here. The whole suite is a script
(figures in docs/reliability.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUBSET = [
    # collectives
    "test_all_reduce_sum", "test_all_reduce_max", "test_all_reduce_sum_async", "test_all_reduce_sum_complex",
    "test_all_reduce_complex_unsupported_ops", "test_all_reduce_coalesced_sum", "test_all_reduce_full_group_sum",
    "test_reduce_sum", "test_reduce_full_group_max", "test_all_gather", "test_all_gather_coalesced_simple",
    "test_gather_checks", "test_scatter", "test_scatter_full_group", "test_broadcast", "test_sparse_all_reduce_sum",
    "test_get_future",
    # p2p
    "test_send_recv", "test_send_recv_with_tag", "test_send_recv_any_source", "test_isend", "test_irecv",
    "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",
    # barriers; a group timeout that fires on purpose
    "test_barrier", "test_barrier_timeout_global", "test_monitored_barrier_gloo",
    "test_monitored_barrier_gloo_subgroup", "test_monitored_barrier_gloo_rank_0_timeout",
    # DDP
    "test_DistributedDataParallelCPU", "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_grads_same_across_ranks_with_no_sync", "test_static_graph_api_cpu", "test_ddp_create_graph",
    # objects, groups, profiler
    "test_all_gather_object_subgroup", "test_scatter_object_list", "test_get_backend", "test_Backend_enum_class",
    "test_destroy_group", "test_get_rank_size_group", "test_send_recv_autograd_profiler", "test_isend_torch_profiler",
]
# Tests whose outcome torch itself makes differ for any plugin backend (docs/design.md, "torch's own suite"),
# with the line of the failure that says why.
KNOWN = {"test_ddp_logging_data_cpu": "AssertionError: String comparison failed: 'custom' != 'frnccl'"}


def _torch_suite_importable() -> None:
    """torch's test utilities import expecttest and numpy, which a torch install does not bring."""
    import importlib.util

    missing = [m for m in ("expecttest", "numpy") if importlib.util.find_spec(m) is None]
    assert not missing, f"torch's distributed test suite needs {' and '.join(missing)} (bash scripts/install.sh --test)"


@pytest.mark.timeout(560)
def test_torch_suite_subset_same_as_gloo(tmp_path):
    _torch_suite_importable()
    out = tmp_path / "peer.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "peer_suite.py"), "--tests", ",".join(SUBSET + list(KNOWN)),
           "--json", str(out), "--logs", str(tmp_path / "logs"), "--timeout", "240"]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=540,
                          check=False)
    assert out.exists(), f"peer_suite.py wrote no result (exit {proc.returncode}):\n{proc.stdout[-4000:]}"
    runs = json.loads(out.read_text())
    for backend in ("gloo", "frnccl"):
        run = runs[backend]
        assert not run["error"], f"{backend}: {run['error']}\n{proc.stdout[-4000:]}"
        not_passed = {n: o["outcome"] + ": " + o["detail"][-600:] for n, o in run["tests"].items()
                      if n in SUBSET and o["outcome"] != "passed"}
        assert not not_passed, f"{backend}: subset tests that did not pass:\n" + json.dumps(not_passed, indent=1)
    gloo, fr = runs["gloo"]["tests"], runs["frnccl"]["tests"]
    differ = sorted(n for n in gloo if gloo[n]["outcome"] != fr[n]["outcome"])
    assert differ == sorted(KNOWN), f"tests whose outcome differs from gloo's: {differ}\n{proc.stdout[-3000:]}"
    for name, why in KNOWN.items():
        assert gloo[name]["outcome"] == "passed" and why in fr[name]["detail"], (name, fr[name])
    assert "tests whose outcome differs: 1" in proc.stdout and proc.returncode == 1, proc.stdout[-3000:]


def test_unknown_test_name_is_one_clear_line():
    _torch_suite_importable()
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "peer_suite.py"), "--tests", "test_all_reduce_sum,no_such"],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300, check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.strip() == "peer_suite: not a test of DistributedTest._DistTestBase: no_such", proc.stderr
