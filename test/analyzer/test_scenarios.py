"""One synthetic scenario per finding kind, at 8 and 64 ranks."""

import pytest
from conftest import analyse, faults, kinds

from fr_backend.analyzer.report import run
from fr_backend.analyzer.synth import MS, Job

SIZES = [8, 64]


def warmup(j: Job, n: int = 5, pg=None) -> None:
    for _ in range(n):
        j.collective(pg=pg)


@pytest.mark.parametrize("n", SIZES)
def test_healthy_has_no_findings(tmp_path, n):
    j = Job(n)
    warmup(j, 10)
    j.coalesced([("all_reduce", [[4]]), ("all_reduce", [[8]])])
    j.p2p(0, n - 1)
    j.batch_p2p([(r, (r + 1) % n) for r in range(n)])
    warmup(j, 3)
    a = analyse(j, tmp_path)
    assert a.findings == []
    assert a.res.missing == []


@pytest.mark.parametrize("n", SIZES)
def test_not_joined(tmp_path, n):
    j = Job(n)
    warmup(j)
    bad = n // 2 + 1
    j.set_stacks(bad, 'Thread 0x7f (most recent call first):\n  File "model.py", line 7 in data_loader_next\n')
    j.collective(ranks=[r for r in range(n) if r != bad], state="started")
    a = analyse(j, tmp_path)
    f = a.findings[0]
    assert (f.kind, f.culprit_ranks, f.collective_seq_id, f.pg) == ("not_joined", [bad], 6, "0")
    assert f.victims == [r for r in range(n) if r != bad]
    assert any("data_loader_next" in e for e in f.evidence)
    assert any("last op" in e and "seq 5" in e for e in f.evidence)
    assert len(faults(a)) == 1


def test_culprit_is_placed_by_its_own_frame_not_torchs(tmp_path):
    """The culprit's last op was issued through torch's wrappers: the evidence names the caller's frame."""
    j = Job(4)
    warmup(j)
    torch_frames = [{"name": "all_reduce", "filename": "/env/lib/site-packages/torch/distributed/distributed_c10d.py",
                     "line": 3245},
                    {"name": "wrapper", "filename": "/env/lib/site-packages/torch/distributed/c10d_logger.py", "line": 81}]
    j.ranks[3].entries[-1]["frames"] = torch_frames + [{"name": "load_batch", "filename": "/job/data.py", "line": 7}]
    j.collective(ranks=[0, 1, 2], state="started")
    a = analyse(j, tmp_path)
    f = a.findings[0]
    assert (f.kind, f.culprit_ranks) == ("not_joined", [3])
    assert any("called from load_batch (/job/data.py:7)" in e for e in f.evidence), f.evidence


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", ["op_mismatch", "size_mismatch", "dtype_mismatch"])
def test_mismatch_blames_minority(tmp_path, n, kind):
    j = Job(n)
    warmup(j)
    bad = {3, n - 1}
    kw = {"op_mismatch": {"op_by_rank": {r: "broadcast" for r in bad}},
          "size_mismatch": {"sizes_by_rank": {r: [[5, 5]] for r in bad}, "out_sizes_by_rank": {r: [[5, 5]] for r in bad}},
          "dtype_mismatch": {"dtype_by_rank": {r: "Half" for r in bad}}}[kind]
    j.collective(state="started", **kw)
    a = analyse(j, tmp_path)
    f = a.findings[0]
    assert (f.kind, f.culprit_ranks, f.collective_seq_id) == (kind, sorted(bad), 6)
    assert "hangs" in f.detail
    assert len(faults(a)) == 1  # waiting in the mismatched op is not blamed again


def test_a_mismatch_that_crashed_the_job_is_not_called_a_hang(tmp_path):
    """gloo fails (or aborts) a size mismatch at once: dumps of reason error say where the job failed, not that
    it hangs; the same dumps of a timeout still say it hangs."""
    j = Job(4)
    warmup(j)
    j.collective(state="started", sizes_by_rank={1: [[5, 5]]}, out_sizes_by_rank={1: [[5, 5]]})
    crashed = run([_write_edited(j, tmp_path / "crash", lambda r, d: d.update(dump_reason="error"))], jobs=1)
    f = crashed.findings[0]
    assert (f.kind, f.culprit_ranks) == ("size_mismatch", [1]), crashed.findings
    assert "hangs" not in f.detail and "this is where the job failed" in f.detail, f.detail
    hung = run([_write_edited(j, tmp_path / "hang", lambda r, d: d.update(dump_reason="timeout"))], jobs=1)
    assert "this is why the job hangs" in hung.findings[0].detail, hung.findings[0].detail


@pytest.mark.parametrize("n", SIZES)
def test_p2p_unmatched(tmp_path, n):
    j = Job(n)
    warmup(j)
    j.p2p(1, n - 2)  # matched
    j.p2p(2, n - 1, recv=False, state="started")  # rank n-1 never posts the recv
    a = analyse(j, tmp_path)
    f = a.findings[0]
    assert (f.kind, f.culprit_ranks, f.victims) == ("p2p_unmatched", [n - 1], [2])
    assert f.p2p_seq_id == 1 and f.collective_seq_id is None  # rank 2's first p2p
    assert len(faults(a)) == 1


@pytest.mark.parametrize("n", SIZES)
def test_straggler(tmp_path, n):
    j = Job(n, step_ns=200 * MS)
    slow = n - 3
    for i in range(20):
        j.collective(delay_ns={slow: 40 * MS + i * MS, (i % n): 2 * MS})
    a = analyse(j, tmp_path)
    assert kinds(a) == ["straggler"]
    f = a.findings[0]
    assert f.culprit_ranks == [slow]
    # its 2 ms at the collectives where it is also the (i % n) rank are within the group's pace
    assert f"{20 - sum(i % n == slow for i in range(20))} of 20" in f.detail


def test_straggler_victim_not_blamed(tmp_path):
    """tp groups {0,1},{2,3}; dp groups {0,2},{1,3}; rank 3 is slow in tp1. Rank 2 waits for it there, and both
    reach their dp all_reduce late, straight out of tp1 (0.4 ms after it ended): late because of tp1, where rank
    3 is late by its own doing. Rank 3 alone is named, once."""
    j = Job(4, step_ns=10 * MS)
    tp = [j.new_pg("tp0", [0, 1]), j.new_pg("tp1", [2, 3])]
    dp = [j.new_pg("dp0", [0, 2]), j.new_pg("dp1", [1, 3])]
    for _ in range(10):
        j.collective(pg=tp[0])
        # ticks 10 ms apart: tp1 at T, ends at T + 30 + 1.1 ms; dp0 at T + 10, dp1 at T + 20
        j.collective(pg=tp[1], delay_ns={3: 30 * MS})
        j.collective(pg=dp[0], delay_ns={2: 21_500_000})
        j.collective(pg=dp[1], delay_ns={3: 11_500_000})
    a = analyse(j, tmp_path)
    assert [(f.kind, f.culprit_ranks, f.pg) for f in a.findings] == [("straggler", [3], "tp1")], [
        f.detail for f in a.findings]


def test_ranks_late_together_are_named_together(tmp_path):
    """Ranks 2 and 3 do the same extra work before every world all_reduce: which of them is last is chance. They
    are named together, in one finding, or not at all; never one of them."""
    import random

    rng = random.Random(1)
    j = Job(8, step_ns=50 * MS)
    for _ in range(40):
        extra = 20 * MS
        j.collective(delay_ns={r: rng.randrange(200_000) + (extra if r in (2, 3) else 0) for r in range(8)})
    a = analyse(j, tmp_path)
    assert [(f.kind, f.culprit_ranks) for f in a.findings] == [("straggler", [2, 3])], [f.detail for f in a.findings]


def test_rank_that_leaves_the_previous_op_late_is_not_a_straggler(tmp_path):
    """Every step: the world all_reduce, a send 0 -> 1 in pair {0,1}, the pairs' all_reduces. Rank 1's recv ends 6
    ms after rank 0's send (as a CPU group's member can leave an op later than its peer, every step) and, after the
    same compute as rank 0, rank 1 reaches the pair's all_reduce 6 ms after it: late because of where it came
    from, not by its own doing; no straggler. With its recv ending on time, the same arrivals are its own doing."""
    j = Job(4, step_ns=50 * MS)
    pa, pb = j.new_pg("1", [0, 1], "pair_a"), j.new_pg("2", [2, 3], "pair_b")
    for _ in range(30):
        j.collective()
        j.p2p(0, 1, pg=pa)
        j.collective(pg=pa, delay_ns={1: 6 * MS})
        j.collective(pg=pb)
    a = run([_write_edited(j, tmp_path / "own", lambda r, d: None)], jobs=1)
    assert [(f.kind, f.culprit_ranks) for f in a.findings] == [("straggler", [1])], [f.detail for f in a.findings]

    def late_recv_end(r, d):
        for e in d["entries"] if r == 1 else ():
            if e["is_p2p"]:
                e["time_discovered_completed_ns"] += 6 * MS
                e["time_gpu_completed_ns"] += 6 * MS

    a = run([_write_edited(j, tmp_path, late_recv_end)], jobs=1)  # (edits the job's entries in place: last)
    assert a.findings == [], [f.detail for f in a.findings]


def test_lateness_inherited_from_a_slow_pair_is_not_named_there(tmp_path):
    """Pairs {0,1} {2,3}, then the world all_reduce. Rank 2 is late at its pair's all_reduce by its own doing;
    rank 3 waits for it there and then reaches the world all_reduce last (with rank 2, straight out of the pair's
    op). Rank 2 is named, once, in its pair; rank 3, last in the world group, is not."""
    j = Job(4, step_ns=10 * MS)
    pa, pb = j.new_pg("1", [0, 1], "pair_a"), j.new_pg("2", [2, 3], "pair_b")
    for _ in range(30):
        j.collective(pg=pa)
        j.collective(pg=pb, delay_ns={2: 30 * MS})  # ends at T + 31.1 ms
        j.collective(delay_ns={2: 21_300_000, 3: 21_500_000})  # world at T + 10: both straight out of pair_b
    a = analyse(j, tmp_path)
    assert [(f.kind, f.culprit_ranks, f.pg_desc) for f in a.findings] == [("straggler", [2], "pair_b")], [
        f.detail for f in a.findings]


@pytest.mark.parametrize("n", SIZES)
def test_missing_dump_is_the_suspect(tmp_path, n):
    j = Job(n)
    warmup(j)
    j.collective(ranks=[r for r in range(n) if r != 5], state="started")
    a = analyse(j, tmp_path, ranks=[r for r in range(n) if r != 5])
    f = a.findings[0]
    assert (f.kind, f.severity, f.culprit_ranks) == ("missing_dump", "suspect", [5])
    assert a.res.missing == [5]


@pytest.mark.parametrize("n", SIZES)
def test_missing_dump_behind_a_rank_that_finished_its_part(tmp_path, n):
    """A rank killed inside an op: one member already finished its part of it (a ring all_reduce lets it) and
    waits in the next op for a rank still inside this one, which waits for the dead rank. Nobody is stuck by
    itself, nor in a cycle: the missing rank is the suspect, first, and both others are its victims."""
    j = Job(n)
    warmup(j)
    dead, ahead = 1, 2
    live = [r for r in range(n) if r != dead]
    j.collective(ranks=live, state={r: "completed" if r == ahead else "started" for r in live})
    j.collective(ranks=[ahead], state="started")
    a = analyse(j, tmp_path, ranks=live)
    f = a.findings[0]
    assert (f.kind, f.severity, f.culprit_ranks, f.collective_seq_id) == ("missing_dump", "suspect", [dead], 6), a.findings
    assert f.victims == live, f.victims
    assert not {"stuck", "deadlock"} & set(kinds(a)), kinds(a)


@pytest.mark.parametrize("n", SIZES)
def test_missing_dump_informational(tmp_path, n):
    j = Job(n)
    warmup(j)
    a = analyse(j, tmp_path, ranks=[r for r in range(n) if r != 0])
    assert kinds(a) == ["missing_dump"]
    assert a.findings[0].severity == "info" and a.findings[0].ranks == [0]
    assert a.res.world_size == n


@pytest.mark.parametrize("n", SIZES)
def test_truncated_at_different_points_is_no_mismatch(tmp_path, n):
    j = Job(n)
    tp = j.new_pg("tp", range(0, n, 2))
    for i in range(30):
        j.collective()
        if i % 3 == 0:
            j.collective(pg=tp)
        if i % 7 == 0:
            j.coalesced([("broadcast", [[4]]), ("broadcast", [[8]])])
    for r in range(n):
        j.truncate(r, keep_last=5 + (r * 7) % 23)  # cuts inside coalesced groups on some ranks
    a = analyse(j, tmp_path)
    assert kinds(a) == ["truncated"]
    assert a.findings[0].severity == "info"
    # and a real fault is still found behind the cut history
    j.collective(ranks=[r for r in range(n) if r != 1], state="started")
    a = analyse(j, tmp_path / "2")
    assert faults(a)[0].kind == "not_joined" and faults(a)[0].culprit_ranks == [1]


@pytest.mark.parametrize("fmt", ["torch", "pickle"])
def test_truncated_torch_format_infers_cut(tmp_path, fmt):
    j = Job(8)
    for i in range(20):
        j.collective()
        j.coalesced([("broadcast", [[4]]), ("broadcast", [[4]])])
    for r in range(8):
        j.truncate(r, keep_last=4 + r * 3)
    a = analyse(j, tmp_path, fmt)
    assert faults(a) == []


@pytest.mark.parametrize("n", SIZES)
def test_chain_of_waits_across_groups(tmp_path, n):
    # pg A = all ranks but 3; pg B = {1, 3}. Rank 3 never joins B seq 7, so rank 1 is stuck there and never
    # joins A seq 5, where everyone else waits. Culprit: 3, not 1.
    j = Job(n)
    A = j.new_pg("A", [r for r in range(n) if r != 3], "dp")
    B = j.new_pg("B", [1, 3], "pipe")
    warmup(j, 4, A)
    warmup(j, 6, B)
    j.collective(pg=B, ranks=[1], state="started")
    j.collective(pg=A, ranks=[r for r in A.ranks if r != 1], state="started")
    a = analyse(j, tmp_path)
    f = a.findings[0]
    assert (f.kind, f.culprit_ranks, f.pg, f.collective_seq_id) == ("not_joined", [3], "B", 7)
    assert 1 in f.victims and 0 in f.victims and 3 not in f.victims
    assert all(3 in x.culprit_ranks or not x.culprit_ranks for x in faults(a))
    assert not any(1 in x.culprit_ranks for x in a.findings)
    assert any("for rank 1" in e for e in f.evidence)


@pytest.mark.parametrize("n", SIZES)
def test_tp_dp_topology(tmp_path, n):
    tpsize = 4
    j = Job(n)
    tps = [j.new_pg(f"tp{i}", range(i * tpsize, (i + 1) * tpsize), "tp") for i in range(n // tpsize)]
    dps = [j.new_pg(f"dp{k}", range(k, n, tpsize), "dp") for k in range(tpsize)]
    for _ in range(3):
        for g in tps:
            j.collective("all_gather_into_tensor", g, sizes=[[16]], out_sizes=[[16 * tpsize]])
        for g in dps:
            j.collective("reduce_scatter_tensor", g, sizes=[[64]], out_sizes=[[64 // len(g.ranks)]])
    bad = 6  # in tp1 and dp2: never joins its tp all_gather
    t = tps[bad // tpsize]
    j.collective("all_gather_into_tensor", t, sizes=[[16]], out_sizes=[[64]], ranks=[r for r in t.ranks if r != bad],
                 state="started")
    # the tp peers of rank 6 are stuck, so their dp groups wait on them
    for g in dps:
        j.collective("reduce_scatter_tensor", g, sizes=[[64]], out_sizes=[[64 // len(g.ranks)]],
                     ranks=[r for r in g.ranks if r not in t.ranks], state="started")
    a = analyse(j, tmp_path)
    f = a.findings[0]
    assert (f.kind, f.culprit_ranks, f.pg) == ("not_joined", [bad], t.name)
    # rank 6 is also a non-joiner of its dp group; its tp peers are victims
    assert set(t.ranks) - {bad} <= set(f.victims)
    assert [x.culprit_ranks for x in faults(a)] == [[bad]]


def test_deadlock_cycle(tmp_path):
    j = Job(2)
    A, B = j.new_pg("A", [0, 1]), j.new_pg("B", [0, 1])
    warmup(j, 2, A)
    j.collective(pg=A, ranks=[0], state="started")  # rank 0: A then B
    j.collective(pg=B, ranks=[1], state="started")  # rank 1: B then A
    a = analyse(j, tmp_path)
    f = a.findings[0]
    assert f.kind == "deadlock" and f.culprit_ranks == [0, 1]


def test_mismatch_followed_by_shift_is_one_root_cause(tmp_path):
    # rank 2 calls broadcast where the others call all_reduce, then goes on to the next collective
    j = Job(8)
    warmup(j)
    j.collective(op_by_rank={2: "broadcast"}, state="started")
    j.collective(ranks=[2], state="started")
    a = analyse(j, tmp_path)
    assert faults(a)[0].kind == "op_mismatch" and faults(a)[0].culprit_ranks == [2]
    assert all(f.culprit_ranks in ([2], []) for f in faults(a))


def test_stuck_inside_op_all_joined(tmp_path):
    j = Job(4)
    B = j.new_pg("B", [2, 3])
    warmup(j)
    j.collective(pg=B, state="started")  # 2 and 3 both inside, never completes
    j.collective(ranks=[0, 1], state="started")  # 0,1 wait on 2,3 in the default pg
    a = analyse(j, tmp_path)
    f = a.findings[0]
    assert f.kind == "stuck" and f.culprit_ranks == []
    assert f.pg == "B"


@pytest.mark.parametrize("kind", ["size_mismatch", "op_mismatch"])
def test_tie_with_a_missing_member_is_ambiguous(tmp_path, kind):
    """3 ranks; rank 2 issues a different all_reduce; rank 1 crashed on the data it got and left no dump.
    The two dumps tie 1-1 and the missing rank would break the tie: no rank is blamed (rank 0 is innocent),
    and the missing rank is not called the likely culprit either."""
    j = Job(3)
    warmup(j, 3)
    kw = {"size_mismatch": {"sizes_by_rank": {2: [[512]]}, "out_sizes_by_rank": {2: [[512]]}},
          "op_mismatch": {"op_by_rank": {2: "all_gather"}}}[kind]
    j.collective(sizes=[[1024]], state="started", **kw)
    a = analyse(j, tmp_path, ranks=[0, 2])
    assert len(faults(a)) == 1
    f = faults(a)[0]
    assert (f.kind, f.culprit_ranks, f.collective_seq_id) == (kind, [], 4)
    assert f.ranks == [0, 1, 2] and "ambiguous" in f.detail and "rank 1" in f.detail
    assert f.to_json()["culprit_ranks"] == []
    assert [x.kind for x in a.findings if x.severity == "info"] == ["missing_dump"]


def test_tie_with_every_member_present_names_both_sides(tmp_path):
    """Without missing members, a 1-1 tie still names both sides (nothing can break it)."""
    j = Job(2)
    warmup(j, 3)
    j.collective(sizes=[[1024]], sizes_by_rank={1: [[512]]}, out_sizes_by_rank={1: [[512]]}, state="started")
    f = faults(analyse(j, tmp_path))[0]
    assert (f.kind, f.culprit_ranks) == ("size_mismatch", [0, 1]) and "no majority" in f.detail


def test_majority_with_a_missing_member_still_blames_the_minority(tmp_path):
    j = Job(4)
    warmup(j, 3)
    j.collective(sizes=[[1024]], sizes_by_rank={3: [[512]]}, out_sizes_by_rank={3: [[512]]}, state="started")
    a = analyse(j, tmp_path, ranks=[0, 1, 3])
    f = faults(a)[0]
    assert (f.kind, f.culprit_ranks) == ("size_mismatch", [3])


def _write_edited(j: Job, root, edit) -> str:
    """The job's frnccl dumps with ``edit(rank, dump)`` applied, in the incident layout."""
    import pickle

    inc = root / "20260101-000000-timeout-0"
    (inc / "pickle").mkdir(parents=True)
    for r in range(j.world_size):
        d = j.dump(r)
        edit(r, d)
        (inc / "pickle" / f"frnccl_rank_{r}").write_bytes(pickle.dumps(d, protocol=2))
    return str(inc)


@pytest.mark.parametrize("n", SIZES)
def test_every_member_inside_one_collective_is_stuck(tmp_path, n):
    """Every rank issued seq 6 and is inside it, none completed: one stuck finding for the group and seq."""
    from fr_backend.analyzer.report import exit_code

    j = Job(n)
    warmup(j)
    j.collective(state="started")
    a = analyse(j, tmp_path)
    assert len(faults(a)) == 1, a.findings
    f = faults(a)[0]
    assert (f.kind, f.pg, f.collective_seq_id, f.culprit_ranks) == ("stuck", "0", 6, [])
    assert f.ranks == list(range(n)) and "does not finish" in f.detail
    assert exit_code(a.findings) == 1


@pytest.mark.parametrize("n", SIZES)
def test_stuck_names_the_rank_that_never_started_it(tmp_path, n):
    """All enqueued seq 6; rank 3's is only scheduled while the others started it: rank 3 is named."""
    j = Job(n)
    warmup(j)
    j.collective(state={r: ("scheduled" if r == 3 else "started") for r in range(n)})
    fs = faults(analyse(j, tmp_path))
    assert [(f.kind, f.culprit_ranks, f.collective_seq_id) for f in fs] == [("stuck", [3], 6)]
    assert "never started" in fs[0].detail and 3 not in fs[0].victims


def test_every_rank_scheduled_names_no_rank(tmp_path):
    """Without start times (every rank 'scheduled') the states cannot tell who is behind."""
    j = Job(4)
    warmup(j)
    j.collective(state="scheduled")
    fs = faults(analyse(j, tmp_path))
    assert [(f.kind, f.culprit_ranks) for f in fs] == [("stuck", [])]


def test_stuck_names_the_rank_whose_error_triggered_the_dumps(tmp_path):
    """frnccl marks a failed op completed: rank 3's seq 6 ended, the others are inside it; the dumps say
    dump_reason=error, trigger_rank=3."""
    j = Job(8)
    warmup(j)
    j.collective(state={r: ("completed" if r == 3 else "started") for r in range(8)})

    def edit(r, d):
        d.update(dump_reason="error", trigger_rank=3,
                 dump_detail="NCCL error in all_reduce seq 6" if r == 3 else "requested by rank 3")

    a = run([_write_edited(j, tmp_path, edit)], jobs=1)
    fs = faults(a)
    assert [(f.kind, f.culprit_ranks, f.collective_seq_id) for f in fs] == [("stuck", [3], 6)]
    assert "NCCL error in all_reduce seq 6" in fs[0].detail
    assert fs[0].victims == [0, 1, 2, 4, 5, 6, 7]


def test_rank_ahead_of_a_stuck_collective_gives_one_finding(tmp_path):
    """Rank 2 finished its part of seq 6 and waits in seq 7; the others are inside seq 6: one stuck finding
    for pg 0 seq 6 (not one per rank), rank 2 a victim."""
    j = Job(8)
    warmup(j)
    j.collective(state={r: ("completed" if r == 2 else "started") for r in range(8)})
    j.collective(ranks=[2], state="started")
    a = analyse(j, tmp_path)
    assert [(f.kind, f.collective_seq_id, f.culprit_ranks) for f in faults(a)] == [("stuck", 6, [])]
    assert faults(a)[0].victims == list(range(8))


def test_op_in_flight_on_a_manual_dump_is_a_note(tmp_path):
    """A dump asked for by hand while every rank is inside a collective issued 10 ms earlier: in flight, exit 0."""
    from fr_backend.analyzer.report import exit_code

    j = Job(4)
    warmup(j)
    j.collective(state="started")
    a = run([_write_edited(j, tmp_path, lambda r, d: d.update(dump_reason="manual"))], jobs=1)
    assert faults(a) == [] and exit_code(a.findings) == 0
    assert [f.kind for f in a.findings] == ["stuck"] and "in flight" in a.findings[0].detail
    # the same dump an hour after the op was issued: a hang
    a = run([_write_edited(j, tmp_path / "late", lambda r, d: d.update(dump_reason="manual",
                                                                       dump_time_ns=d["dump_time_ns"] + 3600 * 10**9))],
            jobs=1)
    assert [f.kind for f in faults(a)] == ["stuck"]


def _with_timeout(timeout_ms: int, reason: str, later_ns: int = 0):
    def edit(r, d):
        d.update(dump_reason=reason, dump_time_ns=d["dump_time_ns"] + later_ns)
        for cfg in d["pg_config"].values():
            cfg["timeout_ms"] = timeout_ms
    return edit


@pytest.mark.parametrize("reason", ["signal", "manual", "teardown"])
def test_rank_in_compute_on_a_requested_dump_is_no_fault_within_the_timeout(tmp_path, reason):
    """A healthy job dumped on request while rank 2 is in its compute and the others wait for it in the next
    all_reduce, 2 s after they issued it, with a 3 s timeout: the job's state in flight, not a fault (exit 0, rank 2
    blamed nowhere). The same dump 4 s after: past the timeout, rank 2 is the culprit."""
    from fr_backend.analyzer.report import exit_code

    j = Job(4)
    warmup(j)
    j.collective(ranks=[0, 1, 3], state="started")
    j.set_stacks(2, 'Thread 0x7f (most recent call first):\n  File "model.py", line 7 in forward\n')
    start = j.dump(0)["dump_time_ns"] - j.now  # the dump's own delay after the op was issued
    a = run([_write_edited(j, tmp_path, _with_timeout(3000, reason, 2 * 10**9 - start))], jobs=1)
    assert faults(a) == [] and exit_code(a.findings) == 0, [f.detail for f in a.findings]
    (f,) = a.findings
    assert (f.kind, f.severity, f.culprit_ranks, f.ranks) == ("not_joined", "info", [], [2]), f.detail
    assert "in flight" in f.detail and "timeout of 3000.0 ms" in f.detail, f.detail
    a = run([_write_edited(j, tmp_path / "late", _with_timeout(3000, reason, 4 * 10**9 - start))], jobs=1)
    assert [(f.kind, f.culprit_ranks) for f in faults(a)] == [("not_joined", [2])]
    # a dump of a failure is judged as ever
    a = run([_write_edited(j, tmp_path / "timeout", _with_timeout(3000, "timeout", 2 * 10**9 - start))], jobs=1)
    assert [(f.kind, f.culprit_ranks) for f in faults(a)] == [("not_joined", [2])]


@pytest.mark.parametrize("op", ["all_to_all_single", "all_to_all", "all_gather_v", "reduce_scatter_v"])
def test_dtypes_compared_for_ops_whose_sizes_differ(tmp_path, op):
    """Uneven sizes are legal for these ops, a different dtype is not: dtype_mismatch naming the odd rank."""
    j = Job(8)
    warmup(j)
    uneven = {r: [[8 + r]] for r in range(8)}
    j.collective(op, sizes_by_rank=uneven, out_sizes_by_rank=uneven)  # sizes differ, dtypes agree: fine
    assert faults(analyse(j, tmp_path / "ok")) == []
    j.collective(op, sizes_by_rank=uneven, out_sizes_by_rank=uneven, dtype_by_rank={3: "BFloat16"},
                 state="started")
    fs = faults(analyse(j, tmp_path / "bad"))
    assert [(f.kind, f.culprit_ranks, f.collective_seq_id) for f in fs] == [("dtype_mismatch", [3], 7)]


def test_barrier_dtypes_are_not_compared(tmp_path):
    j = Job(4)
    j.collective("barrier", dtype_by_rank={1: "Byte"})
    assert analyse(j, tmp_path).findings == []


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("ahead", [2, 3])
def test_rank_several_seqs_ahead_waits_for_the_others(tmp_path, n, ahead):
    """Rank 0 (a root) completed ahead-1 broadcasts alone (small eager sends) and waits in the next
    all_reduce; the others never got past seq 5: they are not_joined, rank 0 their victim."""
    j = Job(n)
    warmup(j)
    for _ in range(ahead - 1):
        j.collective("broadcast", ranks=[0], state="completed")
    j.collective(ranks=[0], state="started")
    fs = faults(analyse(j, tmp_path))
    assert [(f.kind, f.culprit_ranks, f.collective_seq_id) for f in fs] == [("not_joined", list(range(1, n)), 5 + ahead)]
    assert fs[0].victims == [0] and "after seq 5" in fs[0].detail


def test_missing_ranks_that_could_outvote_the_majority_make_it_ambiguous(tmp_path):
    """5 ranks: 0,1 pass 1024 elements, 2,3,4 pass 512; 3 and 4 died and left no dump. Among the dumps 0,1 lead
    rank 2 by one, but two missing votes could outvote them: nobody is blamed, the missing ranks are named."""
    j = Job(5)
    warmup(j, 3)
    odd = {r: [[512]] for r in (2, 3, 4)}
    j.collective(sizes=[[1024]], sizes_by_rank=odd, out_sizes_by_rank=odd, state="started")
    a = analyse(j, tmp_path, ranks=[0, 1, 2])
    fs = faults(a)
    assert [(f.kind, f.culprit_ranks, f.collective_seq_id) for f in fs] == [("size_mismatch", [], 4)], a.findings
    assert fs[0].ranks == [0, 1, 2, 3, 4] and "ambiguous" in fs[0].detail


def test_recv_from_any_source_is_inside_communication(tmp_path):
    """Rank 0 is inside dist.recv() with no src (peer -1, 'gloo:recv' with no '1<-0'), ranks 1 and 2 wait in
    all_reduce seq 6 for it: rank 0 is waiting too (a p2p/collective order deadlock), not outside communication."""
    j = Job(3, backend="gloo")
    warmup(j)
    j.ranks[0].p2p_seq["0"] = 1
    j._entry(0, j.default, "recv", [[8]], [[8]], "Float", "started", j._tick(), p2p=True, coll_seq=0, p2p_seq=1,
             peer=-1)
    j.collective(ranks=[1, 2], state="started")
    fs = faults(analyse(j, tmp_path))
    assert [(f.kind, f.culprit_ranks) for f in fs] == [("deadlock", [0, 1, 2])], fs
    assert "not inside any collective" not in " ".join(e for f in fs for e in f.evidence)


def test_recv_from_any_source_waits_for_an_idle_member(tmp_path):
    """Rank 0 waits in a recv from any source; rank 1 is idle (outside communication), rank 2 waits in
    the next all_reduce for rank 0: rank 1, the only one that could send, is named."""
    j = Job(3, backend="gloo")
    warmup(j)
    j.ranks[0].p2p_seq["0"] = 1
    j._entry(0, j.default, "recv", [[8]], [[8]], "Float", "started", j._tick(), p2p=True, coll_seq=0, p2p_seq=1,
             peer=-1)
    j.collective(ranks=[2], state="started")
    fs = faults(analyse(j, tmp_path))
    assert fs[0].kind == "p2p_unmatched" and fs[0].culprit_ranks == [1], fs


@pytest.mark.parametrize("blocked_in_send", [False, True])
def test_pending_send_of_a_rank_outside_the_collective_stays_a_deadlock(tmp_path, blocked_in_send):
    """Rank 0 posted a send rank 1 has no recv for yet and never issued the loss all_reduce rank 1 waits in. With
    its stack in user frames it may have gone on into compute after an isend (rank 0 the culprit), or be blocked
    in isend(...).wait() while rank 1 skipped its recv (rank 1 the culprit): no rank of the group went on past a
    p2p op of it, so nothing shows the program posts them asynchronously. Blocked in the send (its stack inside
    torch.distributed) it is plainly waiting. Either way the cycle is a deadlock; no rank is named alone."""
    j = Job(2)
    pp = j.new_pg("pp", [0, 1], "pp")
    for _ in range(4):
        j.p2p(0, 1, pg=pp)
        j.collective()
    j.p2p(0, 1, pg=pp, recv=False, state="scheduled")
    j.collective(ranks=[1], state="started")
    where = ('  File "/env/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2010 in send\n'
             if blocked_in_send else "")
    j.set_stacks(0, 'Thread 0x7f00 (most recent call first):\n' + where + '  File "model.py", line 88 in forward\n')
    fs = faults(analyse(j, tmp_path))
    assert [(f.kind, f.culprit_ranks) for f in fs] == [("deadlock", [0, 1])], fs


def test_peer_still_finishing_the_op_before_is_a_victim_of_a_rank_that_left(tmp_path):
    """Rank 2 left the job with an exception after all_reduce seq 6; ranks 1 and 3 wait for it in seq 7, and rank 0,
    slower on a loaded host, is still inside seq 6, which the other three completed, 2 ms after it issued it. The
    dumps (reason exception) name rank 2 alone, with every other rank its victim: seq 6 is in flight, not a second
    fault. The same dumps an hour later, past the group's timeout, show seq 6 stuck on rank 0."""
    j = Job(4)
    warmup(j)
    j.collective(state={0: "started"})
    j.collective(ranks=[1, 3], state="started")
    note = {"type": "RuntimeError", "message": "boom", "frame": "t.py:3 in f", "traceback": "t.py:3 in f",
            "time_ns": j.now}

    def edit(later_ns: int):
        def apply(r, d):
            _with_timeout(3000, "exception", later_ns)(r, d)
            d.update(trigger_rank=2, exit=note if r == 2 else {})
        return apply

    a = run([_write_edited(j, tmp_path, edit(0))], jobs=1)
    assert [(f.kind, f.culprit_ranks) for f in faults(a)] == [("left_with_exception", [2]), ("not_joined", [2])], \
        [f.detail for f in a.findings]
    first = faults(a)[0]
    assert first.victims == [0, 1, 3], first.detail
    assert first.evidence[0] == "rank 0: still inside an earlier op of pg 0 (in flight), next in line to wait for it"
    assert any(f.kind == "stuck" and f.severity == "info" and "in flight" in f.detail for f in a.findings)
    a = run([_write_edited(j, tmp_path / "late", edit(3600 * 10**9))], jobs=1)
    assert ("stuck", 6) in [(f.kind, f.collective_seq_id) for f in faults(a)], [f.detail for f in a.findings]


@pytest.mark.parametrize("shape", ["not_started", "nobody_waits"])
def test_rank_that_left_never_clears_a_stuck_op_it_does_not_explain(tmp_path, shape):
    """Dumps taken as rank 2 left the job (reason exception), with every rank inside all_reduce seq 6 but rank
    2, which completed its part: "not_started", rank 1 only scheduled it (named, as on any dump); "nobody_waits",
    the others are merely inside it, and nobody waits for rank 2 in an op it never issued. Neither is in flight
    because of rank 2's leaving: the stuck op stays a fault (exit 1), never "no problems"."""
    from fr_backend.analyzer.report import exit_code

    j = Job(4)
    warmup(j)
    j.collective(state={0: "started", 1: "scheduled" if shape == "not_started" else "started", 2: "completed",
                        3: "started"})
    note = {"type": "RuntimeError", "message": "boom", "frame": "t.py:3 in f", "traceback": "t.py:3 in f",
            "time_ns": j.now}

    def apply(r, d):
        _with_timeout(3000, "exception")(r, d)
        d.update(trigger_rank=2, exit=note if r == 2 else {})

    a = run([_write_edited(j, tmp_path, apply)], jobs=1)
    assert exit_code(a.findings) == 1, [f.detail for f in a.findings]
    stuck = [f for f in faults(a) if f.kind == "stuck"]
    assert len(stuck) == 1 and stuck[0].collective_seq_id == 6, [f.detail for f in a.findings]
    assert stuck[0].culprit_ranks == ([1] if shape == "not_started" else []), stuck[0].detail
