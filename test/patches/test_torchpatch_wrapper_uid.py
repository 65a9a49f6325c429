"""Defect 3: _ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL) does not
forward setGroupUid, so the wrapped (plugin) backend has an empty group uid.

Only fixable in C++ (patch 0003, ProcessGroupWrapper.hpp): torch binds no
setGroupUid for Backend. This test shows the defect on the installed torch,
the Python-side workaround, and that the C++ patch applies to the installed
header; it cannot rebuild torch to exercise the fix itself."""

import shutil
import subprocess

import pytest

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchpatch_support as S  # noqa: E402

HDR = "torch/csrc/distributed/c10d/ProcessGroupWrapper.hpp"
DETAIL_ENV = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_FR_BUFFER_SIZE": "64"}


def test_defect_wrapped_plugin_has_empty_group_uid_and_workaround():
    results = S.run_pair("detail", env=DETAIL_ENV)
    for result, _ in results:
        world, wa, ctl = result["world"], result["workaround"], result["control"]
        assert world["backend_type"] == "_ProcessGroupWrapper"
        # The ProcessGroup (i.e. the wrapper) knows its name ...
        assert world["group_name"] == "0"
        # ... but the wrapped backend that ran the all_reduce does not.
        assert world["fr_process_group"][0] == ""
        # Workaround: the creator copies opts.group_id to its backend itself.
        assert wa["backend_type"] == "_ProcessGroupWrapper"
        assert wa["fr_process_group"][0] == wa["group_name"] == "1"
        # Control: same plugin, not wrapped (debug level OFF) -> uid is set.
        assert ctl["backend_type"] == "ProcessGroupGloo"
        assert ctl["fr_process_group"][0] == ctl["group_name"] == "2"


def test_patch_0003_applies_to_installed_header(tmp_path):
    text = S.PATCHES["wrapper_uid"].read_text()
    assert "C++" in text.split("\n---", 1)[0]  # the header says it is a C++ patch
    root = S.apply_patches(["wrapper_uid"], tmp_path / "patched")
    patched = (root / HDR).read_text()
    assert "void setGroupUid(const std::string& pg_uid) override" in patched
    assert "backend_->setGroupUid(pg_uid);" in patched
    assert patched.count("{") == patched.count("}")


@pytest.mark.skipif(shutil.which("git") is None, reason="git not available")
def test_patch_0003_git_apply_check(tmp_path):
    (tmp_path / HDR).parent.mkdir(parents=True)
    (tmp_path / HDR).write_bytes(S.installed_file(HDR).read_bytes())
    r = subprocess.run(
        ["git", "apply", "--check", str(S.PATCHES["wrapper_uid"])],
        cwd=tmp_path, capture_output=True, text=True, timeout=30,
    )
    assert r.returncode == 0, r.stderr
