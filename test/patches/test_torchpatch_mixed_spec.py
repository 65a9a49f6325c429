"""Defect 2: a mixed device:backend spec with a plugin leaves the default
backend type UNDEFINED (upper- vs lower-case plugin key; patch 0002)."""

import py_compile
import shutil
import subprocess

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchpatch_support as S  # noqa: E402

C10D = "torch/distributed/distributed_c10d.py"
HOOK_WARNING = "No backend of type"


def test_defect_mixed_spec_default_backend_undefined():
    results = S.run_pair("mixed")
    for result, stderr in results:
        if S.fixed_upstream("mixed"):
            # What the patch gives, from torch itself.
            assert (result["mixed_name"], result["cpu_gloo_name"]) == ("custom", "gloo"), result
            assert HOOK_WARNING not in stderr
            continue
        assert result["mixed_name"] == "undefined"  # "cpu:gloo,cuda:plug"
        # Side effect: once any plugin is registered, even "cpu:gloo" is UNDEFINED.
        assert result["cpu_gloo_name"] == "undefined"
        assert HOOK_WARNING in stderr


@S.skip_unless_defect_present("mixed")
def test_patch_0002_sets_default_backend_type(tmp_path):
    root = S.apply_patches(["mixed"], tmp_path / "patched")
    results = S.run_pair("mixed", env=S.override_env(root, [C10D]))
    for result, stderr in results:
        assert result["c10d_file"] == str(root / C10D)
        assert result["mixed_name"] == "custom"
        assert result["cpu_gloo_name"] == "gloo"
        assert HOOK_WARNING not in stderr


@S.skip_unless_defect_present("seqnum", "mixed")
def test_patches_0001_and_0002_apply_together(tmp_path):
    root = S.apply_patches(["seqnum", "mixed"], tmp_path / "both")
    py_compile.compile(str(root / C10D), doraise=True)
    # and in the other order, on a fresh copy
    root2 = S.apply_patches(["mixed", "seqnum"], tmp_path / "both_rev")
    assert (root2 / C10D).read_text() == (root / C10D).read_text()
    # git apply accepts them too (the header text before the diff is ignored)
    if shutil.which("git") is None:
        return
    fresh = S.apply_patches([], tmp_path / "fresh")
    (fresh / C10D).parent.mkdir(parents=True, exist_ok=True)
    (fresh / C10D).write_bytes(S.installed_file(C10D).read_bytes())
    r = subprocess.run(
        ["git", "apply", "--check", str(S.PATCHES["seqnum"]), str(S.PATCHES["mixed"])],
        cwd=fresh, capture_output=True, text=True, timeout=30,
    )
    assert r.returncode == 0, r.stderr
