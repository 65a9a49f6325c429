"""torch 2.15's recorder states, never trusted blindly: synthetic dumps in the layout torch 2.15 writes for
gloo groups (synth.Job.dump_torch215_gloo), the shapes of test/test_torch215_recorder.py's real jobs.

Every entry is 'scheduled'; pg_status counts a failed op as completed. A collective that a member never
issued, or whose members issued different ops, cannot have completed: the analyzer judges from what was
issued, says which states it distrusted, and names the rank that deviated, never one on a doubted state.
"""

import pytest
from conftest import faults

from fr_backend.analyzer.fmt import rank_word
from fr_backend.analyzer.report import run
from fr_backend.analyzer.synth import gloo_pairs_fault


def _analyse(tmp_path, shape, newest_ended=True):
    j, culprits = gloo_pairs_fault(shape)
    d = j.write(tmp_path / "dumps", "torch215_gloo", newest_ended=newest_ended)
    return run([d], jobs=1), culprits


@pytest.mark.parametrize("newest_ended", [True, False])
@pytest.mark.parametrize("shape,kind", [("skip", "not_joined"), ("hang", "not_joined"), ("size", "size_mismatch")])
def test_only_the_rank_that_deviated_is_named(tmp_path, shape, kind, newest_ended):
    a, culprits = _analyse(tmp_path, shape, newest_ended)
    fs = faults(a)
    assert fs and fs[0].kind == kind and fs[0].culprit_ranks == culprits, (a.findings, a.res.notes)
    assert {r for f in fs for r in f.culprit_ranks} == set(culprits), a.findings


@pytest.mark.parametrize("shape,doubted", [
    ("skip", {"0": [0, 1, 3], "2": [2]}),  # world seq 6 without rank 2; rank 2's pair op without rank 3
    ("hang", {"1": [0], "0": [2, 3]}),  # rank 0's pair op without rank 1; the world op without ranks 0-1
    ("size", {"0": [0, 1], "2": [2, 3]}),  # the world op without ranks 2-3; the pair op of two sizes
])
def test_contradicted_completions_are_taken_back_and_said(tmp_path, shape, doubted):
    a, _ = _analyse(tmp_path, shape)
    for pg, ranks in doubted.items():
        note = next((n for n in a.res.notes if n.startswith(f"pg {pg}: states distrusted")), None)
        assert note is not None, a.res.notes
        for r in ranks:
            rp = a.res.ranks[r].pgs[pg]
            assert rp.c_state[rp.slot(6)] != 2, (r, pg)  # seq 6 is not taken as completed
        assert f"{rank_word(ranks)} seq 6 completed" in note, note


def test_completions_every_member_confirms_stay(tmp_path):
    """The five good steps: every member issued them, alike; pg_status's completion is kept."""
    a, _ = _analyse(tmp_path, "skip")
    for r, s in a.res.ranks.items():
        for rp in s.pgs.values():
            assert all(rp.c_state[rp.slot(q)] == 2 for q in range(1, 6)), (r, rp.name)
