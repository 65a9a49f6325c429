"""What frnccl does differently across torch versions (2.11 to 2.15), checked against the torch installed.

torch 2.15 attaches a hook-based flight recorder to every group whose backend it does not know to
record itself, and its `"nccl"` builds ProcessGroupNCCL2 unless told otherwise. These tests run on
every torch (the CI leg on the newest torch runs them there: .ci/newest_torch_tests.txt).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.torch_version import TorchVersion

from dist_harness import _env, free_port, run_ranks

NEWEST = TorchVersion(torch.__version__) >= "2.15.0.dev0"
OPS = 25


def _recorder_counts(backend: str, tmp_path) -> list[dict]:
    job = run_ranks("torch_recorder.py", 3, backend, str(OPS), timeout=120,
                    env={"FRNCCL_DUMP_DIR": str(tmp_path / "dumps")}).assert_ok()
    return job.results()


@pytest.mark.timeout(300)
def test_torch_records_nothing_of_frnccl_groups(tmp_path):
    """On a frnccl group frnccl is the only recorder: torch attached no hook and holds no entry for it.

    The same job on plain gloo shows that the counting sees torch's entries where torch records
    (its Gloo groups record themselves), so a zero here is not a counting that cannot fail.
    """
    frnccl = _recorder_counts("frnccl", tmp_path)
    for r in frnccl:
        if NEWEST:
            assert r["recorder_api"], "torch 2.15 has _FR_SELF_RECORDING_BACKENDS; the check below would be void"
            assert r["hooks"] == 0, f"torch attached its recorder to {r['hooks']} frnccl group(s): {r}"
        assert r["entries"] in (0, None), f"torch recorded {r['entries']} entries of frnccl groups: {r}"
    gloo = _recorder_counts("gloo", tmp_path)
    if gloo[0]["entries"] is not None:  # torch's Gloo recorder can be dumped from Python (2.13 on)
        expected = [2 * OPS if r["rank"] in (0, 1) else OPS for r in gloo]
        assert [r["entries"] for r in gloo] == expected, gloo
    else:
        assert not NEWEST, gloo


def _python(code: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, "-c", code], env=_env(0, 1, free_port(), env), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.timeout(300)
@pytest.mark.parametrize("use_nccl2", [None, "0", "1"])
def test_inner_nccl_follows_what_nccl_builds(use_nccl2):
    """frnccl wraps the NCCL backend that torch's own "nccl" builds in the same process."""
    code = (
        "import torch.distributed as dist\n"
        "from torch.distributed import distributed_c10d as c\n"
        "from fr_backend._registration import inner_nccl_kind\n"
        "dist.Backend._ensure_backend_registered('nccl') if hasattr(dist.Backend, '_ensure_backend_registered') else None\n"
        "plugin = dist.Backend._plugins.get('NCCL')\n"
        "creator = getattr(getattr(plugin, 'creator_fn', None), '__name__', '')\n"
        "torch_kind = 'nccl2' if creator == '_create_nccl2_process_group' else 'nccl'\n"
        "print(inner_nccl_kind(), torch_kind)\n"
    )
    env = {} if use_nccl2 is None else {"TORCH_DIST_USE_NCCL2": use_nccl2}
    ours, torchs = _python(code, env).strip().splitlines()[-1].split()
    assert ours == torchs
    has_nccl2 = hasattr(torch._C._distributed_c10d, "ProcessGroupNCCL2")
    assert ours == ("nccl2" if has_nccl2 and use_nccl2 != "0" else "nccl")


@pytest.mark.timeout(300)
def test_config_names_the_build():
    """`frnccl config` says what frnccl was built against and whether its CUDA parts are in."""
    line = next(ln for ln in _python(
        "from fr_backend.cli import main; main(['config'])").splitlines() if ln.startswith("build: "))
    assert f"torch {torch.__version__}" in line
    if torch.version.cuda is None:
        assert "CUDA parts not built (torch is a CPU build)" in line
    else:
        assert "CUDA parts built" in line or "CUDA parts not built (" in line
