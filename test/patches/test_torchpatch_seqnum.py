"""Defect 1: _new_process_group_helper never calls _set_sequence_number_for_group
on plugin backends (patch 0001)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchpatch_support as S  # noqa: E402

C10D = "torch/distributed/distributed_c10d.py"


@S.skip_unless_defect_present("seqnum")
def test_defect_plugin_backend_never_gets_sequence_number(tmp_path):
    results = S.run_pair("seqnum")
    for result, _ in results:
        assert result["allreduce"] == 2.0
        assert not result["c10d_file"].startswith(str(tmp_path))
        # The plugin's backend overrides _set_sequence_number_for_group, but
        # torch never calls it for registered (plugin) backends.
        assert result["seq_set_called"] is False


@S.skip_unless_defect_present("seqnum")
def test_patch_0001_sets_sequence_number_for_plugins(tmp_path):
    root = S.apply_patches(["seqnum"], tmp_path / "patched")
    results = S.run_pair("seqnum", env=S.override_env(root, [C10D]))
    for result, _ in results:
        assert result["c10d_file"] == str(root / C10D)  # really the patched module
        assert result["allreduce"] == 2.0
        assert result["seq_set_called"] is True


@S.skip_unless_defect_present("seqnum")
def test_patch_0001_keeps_plugins_without_sequence_numbers_working(tmp_path):
    # torch's own "fake" plugin backend raises "does not yet support sequence
    # numbers"; the patched helper must tolerate that.
    root = S.apply_patches(["seqnum"], tmp_path / "patched")
    r = S.run_single([str(S.WORKER), "fake", "0", "2", "0"], env=S.override_env(root, [C10D]))
    assert r.returncode == 0, r.stderr
    result = S._parse_result(r.stdout)
    assert result["c10d_file"] == str(root / C10D)
    assert result["ok"] is True
