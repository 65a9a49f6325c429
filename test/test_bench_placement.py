"""scripts/_placement.py: where the ranks of bench_overhead.py --turns run (pure planning; no process is pinned here)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from _placement import parse_cpu_list, plan_placements  # noqa: E402


def two_way_smt(cpu: int, cores: int) -> set[int]:
    """Hyperthreads numbered as Linux does on most x86 hosts: cpu and cpu + cores share a core."""
    return {cpu % cores, cpu % cores + cores}


def test_parse_cpu_list_reads_sysfs_format():
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("") == set()


def test_ranks_near_their_gpus_never_share_a_calling_core():
    # 16 cores, 32 CPUs; GPU 0 near cores 0-7, GPU 1 near cores 8-15.
    allowed = list(range(32))
    local = [list(range(0, 8)) + list(range(16, 24)), list(range(8, 16)) + list(range(24, 32))]
    plan = plan_placements(allowed, local, lambda c: two_way_smt(c, 16))
    assert plan is not None
    assert [p.main for p in plan] == [1, 8]
    assert set(plan[0].others) <= set(local[0]) and set(plan[1].others) <= set(local[1])
    calling_cores = {1, 17, 8, 24}
    for p in plan:
        assert not calling_cores & set(p.others)


def test_ranks_on_one_node_split_it_and_keep_off_each_others_cores():
    # Both GPUs near the same 8 CPUs (4 cores); without NUMA information the same split applies to `allowed`.
    allowed = list(range(8))
    for local in ([allowed, allowed], [[], []]):
        plan = plan_placements(allowed, local, lambda c: two_way_smt(c, 4))
        assert plan is not None
        mains = [p.main for p in plan]
        assert len({c % 4 for c in mains}) == 2, mains  # two physical cores
        for p in plan:
            assert not {m % 4 for m in mains} & {c % 4 for c in p.others}


def test_too_few_cpus_is_no_plan():
    assert plan_placements([0, 1], [[], []], lambda c: {c}) is None
    assert plan_placements(list(range(4)), [[], []], lambda c: two_way_smt(c, 2)) is None
