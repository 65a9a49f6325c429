"""Several independent faults in one job (TP x DP meshes of 16 and 32 ranks): every culprit is named, no innocent
rank is, no culprit is called a victim, and no deadlock of everyone is made up where the deviations explain the
waits."""

import pytest
from conftest import analyse, faults

from fr_backend.analyzer.synth import mesh_faults

# rank -> fault, at 16 ranks (TP groups of 4: {0-3} {4-7} {8-11} {12-15}); at 32 the same ranks, plus 16
CASES = {
    "two_skips": {1: "skip", 6: "skip"},
    "skip_and_hang": {1: "skip", 6: "hang"},
    "skip_and_size": {1: "skip", 6: "size"},
    "hang_and_size": {2: "hang", 13: "size"},
    "three_skips": {1: "skip", 6: "skip", 11: "skip"},
    "skip_hang_size": {1: "skip", 6: "hang", 11: "size"},
}


@pytest.mark.parametrize("n", [16, 32])
@pytest.mark.parametrize("case", list(CASES))
def test_every_independent_culprit_is_named(tmp_path, n, case):
    spec = dict(CASES[case])
    if n == 32:
        spec[17] = "skip"  # one more, in a TP group of the second half
    job, culprits = mesh_faults(n, spec)
    a = analyse(job, tmp_path)
    fs = faults(a)
    text = "\n".join(f"{f.kind} {f.culprit_ranks} victims {f.victims}: {f.detail}" for f in fs)
    named = {r for f in fs for r in f.culprit_ranks}
    assert named == set(culprits), f"named {sorted(named)}, culprits {culprits}\n{text}"
    assert not any(f.kind == "deadlock" for f in fs), text
    for f in fs:
        wrong = set(f.victims) & set(culprits)
        assert not wrong, f"{f.kind} {f.culprit_ranks} calls culprit(s) {sorted(wrong)} victims\n{text}"
    # each skip or hang finding names the ranks of its own group that wait for it
    for f in fs:
        if f.kind == "not_joined":
            c = f.culprit_ranks[0]
            tp_peers = set(range(c - c % 4, c - c % 4 + 4)) - set(culprits)
            assert tp_peers <= set(f.victims), text
