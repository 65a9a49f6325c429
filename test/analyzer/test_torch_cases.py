"""torch's published analyzer scenarios restated for ours, and its known failure modes."""

import os
import pickle

import pytest
from conftest import analyse, faults

from fr_backend.analyzer.report import run, to_json
from fr_backend.analyzer.synth import Job


def two_rank_job(fmt_backend="nccl") -> Job:
    return Job(2, backend=fmt_backend)


def write_torch(tmp_path, dumps):
    d = tmp_path / "torch"
    d.mkdir(exist_ok=True)
    for r, dump in dumps.items():
        (d / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(dump, protocol=2))
    return run([str(d)], jobs=1)


def test_matched_all_reduce_in_two_groups_same_name_different_members(tmp_path):
    # torch's template: pg "1" (sub_pg) is [0] on rank 0 and [1] on rank 1: two different groups
    j = two_rank_job()
    sub0, sub1 = j.new_pg("1", [0], "sub_pg"), None
    j.collective(sizes=[[4, 4]])
    j.collective(pg=sub0, sizes=[[5, 5]])
    dumps = {0: j.dump(0, torch_format=True)}
    j2 = two_rank_job()
    j2.collective(sizes=[[4, 4]])
    sub1 = j2.new_pg("1", [1], "sub_pg")
    j2.collective(pg=sub1, sizes=[[5, 5]])
    dumps[1] = j2.dump(1, torch_format=True)
    a = write_torch(tmp_path, dumps)
    assert a.findings == []
    assert sorted((v.name, v.ranks) for v in a.match.pgs) == [("0", (0, 1)), ("1", (0,)), ("1", (1,))]


def test_allreduce_coalesced_fast_path(tmp_path):
    j = two_rank_job()
    j.collective("allreduce_coalesced", sizes=[[4, 4]])
    assert analyse(j, tmp_path, "torch").findings == []


def test_slow_path_coalesced_broadcasts_match_despite_scheduled_inner_ops(tmp_path):
    j = two_rank_job()
    j.coalesced([("broadcast", [[4, 4]]), ("broadcast", [[4, 4]])], inner_state="scheduled")
    j.collective()
    a = analyse(j, tmp_path, "torch")
    assert a.findings == []
    c = a.res.ranks[0].pgs["0"].colls[1]
    assert c[1] == "coalesced[broadcast,broadcast]" and c[5] == 2  # name, completed (from the marker)


def test_uneven_all_gather_coalesced_size_mismatch(tmp_path):
    j = two_rank_job()
    j.coalesced([("_broadcast_oop", [[4, 4]]), ("_broadcast_oop", [[5, 5]])], marker="ALLGATHER_coalesced",
                ops_by_rank={1: [("_broadcast_oop", [[4, 4]]), ("_broadcast_oop", [[4, 4]])]})
    a = analyse(j, tmp_path, "torch")
    f = faults(a)[0]
    assert f.kind == "size_mismatch" and f.collective_seq_id == 1
    assert f.culprit_ranks == [0, 1] and "no majority" in f.detail  # a 1-1 tie names both sides


def test_uneven_reduce_scatter_matches(tmp_path):
    j = two_rank_job()
    j.coalesced([("_reduce_oop", [[4, 4]]), ("_reduce_oop", [[4, 4]])], marker="REDUCE_SCATTER_coalesced")
    # list-form uneven collectives: inputs differ for all_gather, outputs for reduce_scatter
    j.collective("all_gather", sizes_by_rank={0: [[3]], 1: [[5]]}, out_sizes=[[3], [5]])
    j.collective("reduce_scatter", sizes=[[3], [5]], out_sizes_by_rank={0: [[3]], 1: [[5]]})
    j.collective("all_to_all_single", sizes_by_rank={0: [[3]], 1: [[9]]})
    assert analyse(j, tmp_path, "torch").findings == []


def test_empty_coalesced_call_on_rank0_is_not_joined(tmp_path):
    j = two_rank_job()
    j.collective()
    j.coalesced([("_reduce_oop", [[4, 4]]), ("_reduce_oop", [[4, 4]])], marker="REDUCE_SCATTER_coalesced",
                ranks=[1], state="started")
    f = faults(analyse(j, tmp_path, "torch"))[0]
    assert (f.kind, f.culprit_ranks, f.collective_seq_id) == ("not_joined", [0], 2)
    assert f.op == "REDUCE_SCATTER_coalesced[_reduce_oop,_reduce_oop]"


def test_verdict_does_not_depend_on_listing_order(tmp_path):
    # the odd one out is rank 0, the rank torch takes as reference
    j = Job(4)
    j.collective()
    j.collective(sizes_by_rank={0: [[9]]}, out_sizes_by_rank={0: [[9]]}, state="started")
    d = j.write(tmp_path / "a", "torch")
    names = sorted(os.listdir(d))
    a1 = run([os.path.join(d, n) for n in names], jobs=1)
    a2 = run([os.path.join(d, n) for n in reversed(names)], jobs=1)
    assert to_json(a1)["findings"] == to_json(a2)["findings"]
    assert faults(a1)[0].culprit_ranks == [0]


def test_keeps_going_after_many_mismatches(tmp_path):
    j = Job(4)
    A = j.new_pg("A", range(4))
    for _ in range(15):  # completed mismatches in A: rank 1 differs in dtype
        j.collective(pg=A, dtype_by_rank={1: "Half"})
    warmup_default = 3
    for _ in range(warmup_default):
        j.collective()
    j.collective(ranks=[0, 1, 3], state="started")
    a = analyse(j, tmp_path, "torch")
    fs = faults(a)
    assert fs[0].kind == "not_joined" and fs[0].culprit_ranks == [2]
    dm = [f for f in fs if f.kind == "dtype_mismatch"]
    assert len(dm) == 1 and dm[0].culprit_ranks == [1] and "14 later seqs" in dm[0].detail


def test_record_ids_per_process_do_not_trim_history(tmp_path):
    # rank 0 also works on a private group, so its record ids run far ahead of the others'
    j = Job(4)
    solo = j.new_pg("solo", [0])
    for _ in range(50):
        j.collective(pg=solo)
    for _ in range(4):
        j.collective()
    j.collective(ranks=[0, 1, 2], state="started")
    a = analyse(j, tmp_path, "torch")
    f = faults(a)[0]
    assert (f.kind, f.culprit_ranks, f.collective_seq_id) == ("not_joined", [3], 5)


def test_p2p_matched_on_p2p_seq_and_global_ranks(tmp_path):
    # pg {2, 5}: names carry group-local ranks "send 0->1"; torch dumps have no 'peer'
    j = Job(6)
    pp = j.new_pg("pp", [2, 5])
    j.collective()
    for _ in range(3):
        j.p2p(2, 5, pg=pp)
        j.p2p(5, 2, pg=pp)
    j.p2p(2, 5, pg=pp, recv=False, state="started")
    a = analyse(j, tmp_path, "torch")
    p2ps = a.res.ranks[2].pgs["pp"].p2ps
    assert {p[2] for p in p2ps} == {5}  # global peer
    assert p2ps[0][-1] == "nccl:send 0->1"
    assert all(e["collective_seq_id"] == 0 for e in j.dump(2)["entries"] if e["is_p2p"])
    f = faults(a)[0]
    assert (f.kind, f.culprit_ranks, f.victims) == ("p2p_unmatched", [5], [2])


def test_all_gather_base_checked_by_its_real_name(tmp_path):
    j = Job(4)
    j.collective("_all_gather_base", sizes=[[4]], out_sizes=[[16]])
    j.collective("_all_gather_base", sizes=[[4]], out_sizes=[[16]], out_sizes_by_rank={2: [[12]]}, state="started")
    f = faults(analyse(j, tmp_path, "torch"))[0]
    assert (f.kind, f.culprit_ranks, f.op) == ("size_mismatch", [2], "_all_gather_base")


def test_gloo_backend_names(tmp_path):
    j = Job(3, backend="gloo")
    j.collective()
    j.collective(ranks=[0, 2], state="started")
    f = faults(analyse(j, tmp_path, "torch"))[0]
    assert (f.kind, f.culprit_ranks) == ("not_joined", [1])


def test_string_seq_ids_as_in_torch_tests(tmp_path):
    j = Job(2)
    j.collective()
    j.collective(ranks=[1], state="started")
    dumps = {}
    for r in range(2):
        d = j.dump(r, torch_format=True)
        for e in d["entries"]:
            e["collective_seq_id"] = str(e["collective_seq_id"])
            e["p2p_seq_id"] = str(e["p2p_seq_id"])
        dumps[r] = d
    f = faults(write_torch(tmp_path, dumps))[0]
    assert (f.kind, f.culprit_ranks) == ("not_joined", [0])


@pytest.mark.parametrize("marker", ["coalesced", "ALLGATHER_coalesced"])
def test_coalesced_group_size_differs_is_op_mismatch(tmp_path, marker):
    j = Job(4)
    j.coalesced([("broadcast", [[4]]), ("broadcast", [[4]])], marker=marker,
                ops_by_rank={3: [("broadcast", [[4]])]}, state="started")
    f = faults(analyse(j, tmp_path, "torch"))[0]
    assert (f.kind, f.culprit_ranks) == ("op_mismatch", [3])


# --------------------------------------------------------------------------- torch's own keys and gloo's dumps


def _local_ids(j: Job, r: int, d: dict) -> dict:
    """As real torch writes them: entries' pg_id and pg_status keys are the process-local id of the group
    (its creation index among the groups this process is a member of), not the synthetic job-wide one."""
    uid: dict[str, int] = {}
    for pg in j.pgs.values():
        if r in pg.ranks:
            uid[str(pg.pg_id)] = len(uid)
    for e in d["entries"]:
        e["pg_id"] = uid[str(e["pg_id"])]
    d["pg_status"] = {str(uid[k]): v for k, v in d["pg_status"].items()}
    return d


def _analyze_truncated_torch_dumps(tmp_path, j: Job, keep: int):
    """Every rank keeps its last `keep` entries (its older groups' ops leave the ring buffer) and writes torch's
    format with process-local ids; returns the analysis of those dumps."""
    for r in range(j.world_size):
        j.truncate(r, keep)
    return write_torch(tmp_path, {r: _local_ids(j, r, j.dump(r, torch_format=True)) for r in range(j.world_size)})


def _gloo_like(j: Job, r: int, ranks_cfg: str) -> dict:
    """torch 2.13's gloo dump: pg_config is {'': {'name': '', ...}} (every group under the empty name, the
    last one created winning), and entries stay 'scheduled' after they finish (retired=True)."""
    d = _local_ids(j, r, j.dump(r, torch_format=True))
    d["pg_config"] = {"": {"name": "", "desc": "", "ranks": ranks_cfg}}
    for e in d["entries"]:
        e["retired"] = e["state"] == "completed"
        e["state"] = "scheduled"
        e["time_discovered_started_ns"] = e["time_discovered_completed_ns"] = 0
    return d


def test_pg_status_keyed_by_process_local_id(tmp_path):
    """Groups '0' {0..3}, '1' {0,1}, '2' {2,3}, '3' {2,3}: on ranks 2 and 3, torch's status key '2' is group
    '3' (used only early, its ops gone from the ring buffer), not group '2'. Rank 2 never issues pg '2' seq 40."""
    j = Job(4)
    g1, g2, g3 = j.new_pg("1", [0, 1], "undefined"), j.new_pg("2", [2, 3], "undefined"), j.new_pg("3", [2, 3])
    for _ in range(100):
        j.collective(pg=g3)
    for step in range(1, 41):
        j.collective()
        j.collective(pg=g1)
        j.collective(pg=g2, ranks=[3] if step == 40 else None, state="started" if step == 40 else "completed")
    a = _analyze_truncated_torch_dumps(tmp_path, j, keep=30)
    f = faults(a)[0]
    assert (f.kind, f.culprit_ranks, f.pg, f.collective_seq_id) == ("not_joined", [2], "2", 40), a.findings
    assert len(faults(a)) == 1
    assert a.res.ranks[2].pgs["3"].last_enqueued_coll == 100  # the status went to the right group


def test_status_of_a_group_without_entries_is_matched_by_elimination(tmp_path):
    """Rank 2's only entries are of the default group; its other status key can only be group '2'."""
    j = Job(3)
    g1, g2 = j.new_pg("1", [0, 1]), j.new_pg("2", [1, 2])
    for step in range(1, 6):
        for _ in range(25):
            j.collective()
        j.collective(pg=g2, ranks=[1] if step == 5 else None, state="started" if step == 5 else "completed")
        j.collective(pg=g1, ranks=[0] if step == 5 else None, state="started" if step == 5 else "completed")
    a = _analyze_truncated_torch_dumps(tmp_path, j, keep=20)
    f = faults(a)[0]
    assert (f.kind, f.culprit_ranks, f.pg, f.collective_seq_id) == ("not_joined", [2], "2", 5), a.findings


def test_unmatchable_status_keys_are_left_out_and_said(tmp_path):
    """Two status keys that no entry names and groups with non-numeric names: no guess, a note."""
    j = Job(2)
    ga, gb = j.new_pg("zz", [0, 1]), j.new_pg("aa", [0, 1])
    j.collective(pg=ga)
    j.collective(pg=gb)
    for _ in range(5):
        j.collective()
    a = _analyze_truncated_torch_dumps(tmp_path, j, keep=5)
    assert faults(a) == []
    assert any("could not be matched" in n for n in a.res.notes), a.res.notes


@pytest.mark.parametrize("mode", ["hang", "size"])
def test_torch_gloo_dumps(tmp_path, mode):
    """Real torch 2.13 gloo dumps: the empty-named pg_config is the only group's; retired ops count as
    completed (from pg_status), and the state's 'scheduled' is said to be unreliable."""
    j = Job(4, backend="gloo")
    for _ in range(3):
        j.collective()
    if mode == "hang":
        j.collective(ranks=[0, 1, 2], state="started")
    else:
        j.collective(sizes_by_rank={3: [[8]]}, out_sizes_by_rank={3: [[8]]}, state="started")
    a = write_torch(tmp_path, {r: _gloo_like(j, r, "[0, 1, 2, 3]") for r in range(4)})
    want = ("not_joined", [3], 4) if mode == "hang" else ("size_mismatch", [3], 4)
    assert [(f.kind, f.culprit_ranks, f.collective_seq_id) for f in faults(a)] == [want], a.findings
    assert any("retired" in n for n in a.res.notes)


def test_torch_gloo_groups_without_members_are_inferred_and_said(tmp_path):
    """Several groups: the empty-named pg_config holds the last one created ('[]' on a non-member), so no
    dump gives members; the default group is every rank, the others the ranks that recorded them."""
    j = Job(4, backend="gloo")
    sub, sub2 = j.new_pg("1", [0, 1], "undefined"), j.new_pg("2", [2, 3], "undefined")
    for _ in range(3):
        j.collective()
    j.collective(pg=sub)
    j.collective(pg=sub2)
    j.collective("barrier")
    j.collective(ranks=[0, 1, 3], state="started")
    a = write_torch(tmp_path, {r: _gloo_like(j, r, "[]") for r in range(4)})
    assert [(f.kind, f.culprit_ranks, f.collective_seq_id) for f in faults(a)] == [("not_joined", [2], 5)]
    assert sorted((v.name, v.ranks) for v in a.match.pgs) == [("0", (0, 1, 2, 3)), ("1", (0, 1)), ("2", (2, 3))]
    assert any("default group" in n for n in a.res.notes) and any(n.startswith("pg 1: ") for n in a.res.notes)


def test_torch_gloo_every_rank_inside_is_stuck_naming_no_rank(tmp_path):
    """All four inside the last all_reduce: stuck; 'scheduled' everywhere names nobody as never started."""
    j = Job(4, backend="gloo")
    for _ in range(3):
        j.collective()
    j.collective(state="started")
    a = write_torch(tmp_path, {r: _gloo_like(j, r, "[0, 1, 2, 3]") for r in range(4)})
    assert [(f.kind, f.culprit_ranks, f.collective_seq_id) for f in faults(a)] == [("stuck", [], 4)], a.findings
