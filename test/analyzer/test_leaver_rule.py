"""The early-exit rule (leaver.py) on synthetic dumps: a 2x2 mesh where one rank left the loop for the closing world
barrier is named ``left_early``; where the shape does not single out one rank the cycle stays a deadlock."""

import pytest
from conftest import analyse, faults

from fr_backend.analyzer.report import to_text
from fr_backend.analyzer.synth import Job

STEPS = 4


def mesh(leavers: dict[int, str]) -> Job:
    """STEPS steps of (tp all_reduce, dp all_reduce) on tp [0,1],[2,3] and dp [0,2],[1,3]; then each rank of
    ``leavers`` enters the closing world op it names, and the others go on to the next step as far as they can."""
    j = Job(4, ranks_per_host=2)
    tp = [j.new_pg("1", [0, 1], "mesh_tp"), j.new_pg("2", [2, 3], "mesh_tp")]
    dp = [j.new_pg("3", [0, 2], "mesh_dp"), j.new_pg("4", [1, 3], "mesh_dp")]
    for _ in range(STEPS):
        for g in tp + dp:
            j.collective(pg=g)
    stay = [r for r in range(4) if r not in leavers]
    done_tp = []
    for g in tp:
        inside = [r for r in g.ranks if r in stay]
        if inside:
            j.collective(pg=g, ranks=inside, state="completed" if len(inside) == 2 else "started")
            done_tp += inside if len(inside) == 2 else []
    for g in dp:
        inside = [r for r in g.ranks if r in done_tp]
        if inside:
            j.collective(pg=g, ranks=inside, state="started")
    for op in sorted(set(leavers.values())):
        j.collective(op, ranks=[r for r, o in leavers.items() if o == op], state="started")
    return j


@pytest.mark.parametrize("leaver", [0, 3])
@pytest.mark.parametrize("closing", ["barrier", "all_reduce"])
def test_one_rank_in_the_closing_op_is_named(tmp_path, leaver, closing):
    a = analyse(mesh({leaver: closing}), tmp_path)
    fs = faults(a)
    assert [(f.kind, f.culprit_ranks) for f in fs] == [("left_early", [leaver])], to_text(a)
    f = fs[0]
    # the named op: the leaver's tp group's all_reduce, which holds up its tp peer and the rank waiting on that peer
    assert (f.op, f.pg_desc, f.collective_seq_id) == ("all_reduce", "mesh_tp", STEPS + 1), to_text(a)
    assert f.victims == sorted(set(range(4)) - {leaver})
    assert f"rank {leaver} left the loop early: it is in {closing}" in f.detail, f.detail


def test_two_ranks_in_the_closing_op_stay_a_deadlock(tmp_path):
    a = analyse(mesh({0: "barrier", 3: "barrier"}), tmp_path)
    assert [(f.kind, f.culprit_ranks) for f in faults(a)] == [("deadlock", [0, 1, 2, 3])], to_text(a)


def test_a_group_of_two_is_one_against_one(tmp_path):
    """Two ranks: rank 1 in the world barrier, rank 0 in the pair's next all_reduce. Either could have left: no rank
    named alone."""
    j = Job(2)
    pair = j.new_pg("1", [0, 1], "pair")
    for _ in range(STEPS):
        j.collective(pg=pair)
    j.collective(pg=pair, ranks=[0], state="started")
    j.collective("barrier", ranks=[1], state="started")
    a = analyse(j, tmp_path)
    assert [(f.kind, f.culprit_ranks) for f in faults(a)] == [("deadlock", [0, 1])], to_text(a)
