"""Shapes where an inference (async p2p, program order, clock offsets, in-flight ops) must not turn a real hang
into exit 0 or name a rank the dumps do not show to be the culprit: 'I don't know' (deadlock, stuck) is the
right answer when the evidence cannot tell two stories apart."""

import random

import pytest
from conftest import analyse, faults

from fr_backend.analyzer import synth
from fr_backend.analyzer.report import exit_code, to_text
from fr_backend.analyzer.synth import COMM_STACK, MS, Job

# a thread blocked in work.wait() of an irecv shows only its caller's frames: none is in torch.distributed
WAIT_STACK = ('Thread 0x7f0000000001 (most recent call first):\n'
              '  File "/env/lib/python3.11/site-packages/megatron/core/pipeline_parallel/p2p_communication.py", '
              'line 360 in _communicate\n  File "/job/train.py", line 90 in step\n')


def verdict(a) -> list[tuple[str, list[int]]]:
    return [(f.kind, f.culprit_ranks) for f in faults(a)]


# --------------------------------------------------------------------------- async p2p


def test_both_ranks_waiting_on_their_irecv_is_a_deadlock_not_exit_0(tmp_path):
    """Each rank waits in irecv(...).wait() for the other's send, which both issue only later; neither stack is
    in torch.distributed. Nobody may be taken for 'posted asynchronously and went on': a deadlock, exit 1."""
    j = Job(2, ranks_per_host=1)
    pp = j.new_pg("1", [0, 1], "pp")
    for _ in range(10):
        j.p2p(0, 1, pg=pp)
        j.p2p(1, 0, pg=pp)
        j.collective("all_reduce")
    j.p2p(1, 0, pg=pp, send=False, state="started")
    j.p2p(0, 1, pg=pp, send=False, state="started")
    for r in range(2):
        j.set_stacks(r, WAIT_STACK)
    a = analyse(j, tmp_path)
    assert exit_code(a.findings) == 1, to_text(a)
    assert verdict(a) == [("deadlock", [0, 1])], to_text(a)


def _recv_waiter_and_collective() -> Job:
    """Rank 0 waits in irecv(...).wait() for rank 1's send; ranks 1-3 wait in the world all_reduce rank 0 never
    issued. Rank 0 may be in compute after an irecv (it is the culprit) or blocked in the wait while rank 1
    skipped its send (rank 1 is): the dumps cannot tell."""
    j = Job(4, ranks_per_host=2)
    pp = j.new_pg("1", [0, 1], "pp")
    for _ in range(10):
        j.p2p(1, 0, pg=pp)
        j.collective("all_reduce")
    j.p2p(1, 0, pg=pp, send=False, state="started")
    j.collective("all_reduce", ranks=[1, 2, 3], state="started")
    for r in range(4):
        j.set_stacks(r, COMM_STACK)
    j.set_stacks(0, WAIT_STACK)
    return j


def test_rank_waiting_on_its_irecv_is_not_named_on_a_coin_flip(tmp_path):
    a = analyse(_recv_waiter_and_collective(), tmp_path)
    v = verdict(a)
    assert exit_code(a.findings) == 1 and v and v[0][0] == "deadlock", to_text(a)
    assert all(k == "deadlock" for k, _ in v), v


def test_async_pipeline_names_the_stage_in_compute_with_the_peers_evidence(tmp_path):
    """The accepted shape: rank 4 posted its isend and went on into the all_reduce (its p2p op is older than the
    collective it is inside: posted asynchronously, shown by the record order), rank 5 hangs in compute with an
    isend of its own pending: rank 5 is named, and the evidence says how rank 4 showed the p2p ops are async."""
    j, _ = synth.pipeline_async(16, 5)
    a = analyse(j, tmp_path)
    assert verdict(a)[0] in (("p2p_unmatched", [5]), ("not_joined", [5])), to_text(a)
    ev = faults(a)[0].evidence
    assert any("rank 4" in e and "asynchronously" in e and "all_reduce" in e for e in ev), ev


def test_both_ranks_waiting_on_their_isend_is_a_deadlock_not_exit_0(tmp_path):
    """Both ranks posted a send to the other and wait on it (work.wait(), user frames only): a head-to-head
    deadlock, not two ranks that went on."""
    j = Job(2)
    pp = j.new_pg("1", [0, 1], "pp")
    for _ in range(5):
        j.p2p(0, 1, pg=pp)
        j.collective()
    j.p2p(0, 1, pg=pp, recv=False, state="scheduled")
    j.p2p(1, 0, pg=pp, recv=False, state="scheduled")
    j.set_stacks(0, WAIT_STACK)
    j.set_stacks(1, WAIT_STACK)
    a = analyse(j, tmp_path)
    assert exit_code(a.findings) == 1 and verdict(a) == [("deadlock", [0, 1])], to_text(a)


# --------------------------------------------------------------------------- program order


def test_pipeline_stages_with_different_orders_do_not_name_an_innocent(tmp_path):
    """Two stages with TP groups of one role: stage 0 ({0,1}) issues world then TP each step, stage 1 ({2,3})
    TP then world, as every step of the history shows. Rank 1 deviates (TP before world). Stage 1's order is
    not rank 0's, so it cannot vote that rank 0 skipped its TP all_reduce: no rank named, a deadlock."""
    j = Job(4, ranks_per_host=2)
    t0 = j.new_pg("1", [0, 1], "mesh_tp")
    t1 = j.new_pg("2", [2, 3], "mesh_tp")
    for _ in range(10):
        j.collective("all_reduce", t1)
        j.collective("all_reduce")
        j.collective("all_reduce", t0)
    j.collective("all_reduce", t1)
    j.collective("all_reduce", ranks=[0, 2, 3], state="started")
    j.collective("all_reduce", t0, ranks=[1], state="started")
    for r in range(4):
        j.set_stacks(r, COMM_STACK)
    a = analyse(j, tmp_path)
    v = verdict(a)
    assert v and all(k == "deadlock" for k, _ in v), to_text(a)
    assert 0 not in [r for k, rs in v if k != "deadlock" for r in rs]


# --------------------------------------------------------------------------- dumps on request, clocks apart


def _teardown(j: Job) -> None:
    orig = j.dump

    def dump(rank, torch_format=False, incident="x"):
        d = orig(rank, torch_format, incident)
        if not torch_format:
            d["dump_reason"] = "teardown"
        return d

    j.dump = dump


def _host_stalled_in_tp(age_ms: int, behind_ms: int) -> Job:
    """6 ranks on 2 hosts: host 1's TP all_reduce unfinished, the world all_reduce waiting on it, `age_ms` before
    the dumps; host 1's clock `behind_ms` behind."""
    j = Job(6, ranks_per_host=3)
    g = j.new_pg("1", [3, 4, 5], "mesh_tp")
    for _ in range(20):
        j.collective("all_reduce")
    j.collective("all_reduce", g, state="started")
    j.collective("all_reduce", ranks=[0, 1, 2], state="started")
    j.now += age_ms * MS
    j.set_clock_offset(-behind_ms * MS, host=1)
    return j


@pytest.mark.parametrize("behind_ms", [0, 600_000 - 300])
def test_old_stall_on_a_host_behind_is_a_hang_not_in_flight(tmp_path, behind_ms):
    """Host 1's TP all_reduce was issued 10 minutes before the teardown dump and never finished; host 1's clock is
    behind by about as much. The op's age is measured on each rank's own clock: a hang (exit 1), not an op in
    flight."""
    j = _host_stalled_in_tp(age_ms=600_000, behind_ms=behind_ms)
    for r in range(6):
        j.set_stacks(r, COMM_STACK)
    _teardown(j)
    a = analyse(j, tmp_path)
    assert exit_code(a.findings) == 1 and [f.kind for f in faults(a)][:1] == ["stuck"], to_text(a)


def test_op_issued_just_before_a_teardown_dump_is_still_in_flight(tmp_path):
    """The counterpart: an op issued 300 ms before the dump, on a host whose clock is 10 minutes behind, is in
    flight (info), whatever the offset."""
    j = _host_stalled_in_tp(age_ms=300, behind_ms=600_000)
    _teardown(j)
    a = analyse(j, tmp_path)
    assert exit_code(a.findings) == 0 and "stuck" in [f.kind for f in a.findings], to_text(a)


def _two_hosts(off_ms: float, tp_per_step: int, hosts: int = 2, rph: int = 4, slow: int | None = None) -> Job:
    """TP groups within each host (several per step), one world all_reduce per step; host 1's clock off."""
    rng = random.Random(0)
    n = hosts * rph
    j = Job(n, ranks_per_host=rph)
    tps = [j.new_pg(str(1 + h), range(h * rph, (h + 1) * rph), "mesh_tp") for h in range(hosts)]
    for _ in range(40):
        for g in tps:
            for _ in range(tp_per_step):
                j.collective("all_reduce", g, delay_ns={r: rng.randrange(200_000) for r in g.ranks})
        j.collective("all_reduce", delay_ns={r: rng.randrange(200_000) + (3 * MS if r == slow else 0)
                                             for r in range(n)})
    j.set_clock_offset(int(off_ms * MS), host=1)
    return j


@pytest.mark.parametrize("tp_per_step", [1, 2, 3])
@pytest.mark.parametrize("off_ms", [5.0, 50.0, -600_000.0])
def test_host_offset_is_measured_by_groups_spanning_hosts(tmp_path, off_ms, tp_per_step):
    """Groups within one host say nothing of its offset: however many there are, the offset comes out right,
    10 minutes too, and nothing is reported on a healthy job."""
    a = analyse(_two_hosts(off_ms, tp_per_step), tmp_path)
    est = {h.host: h.offset_ns for h in a.match.clocks.hosts}
    assert abs(est["host1"] - est["host0"] - off_ms * MS) < 0.1 * MS, (est, off_ms)
    assert a.findings == [], to_text(a)


def test_no_false_straggler_when_small_hosts_have_offsets(tmp_path):
    j = _two_hosts(5.0, 2, hosts=4, rph=2)
    a = analyse(j, tmp_path)
    assert a.findings == [], to_text(a)


def test_straggler_of_the_reference_host_is_found_with_an_offset_elsewhere(tmp_path):
    a = analyse(_two_hosts(5.0, 2, slow=2), tmp_path)
    assert [(f.kind, f.culprit_ranks) for f in a.findings] == [("straggler", [2])], to_text(a)


def test_hang_with_a_host_ten_minutes_behind_has_no_false_stragglers(tmp_path):
    """Host 1's TP all_reduce hangs (a network fault), host 0 waits for it in the world all_reduce; host 1's clock
    is 10 minutes behind. The verdict is the stuck op, with no straggler from a mis-estimated offset."""
    j = Job(8, ranks_per_host=4)
    tps = [j.new_pg("1", [0, 1, 2, 3], "mesh_tp"), j.new_pg("2", [4, 5, 6, 7], "mesh_tp")]
    for _ in range(20):
        for g in tps:
            j.collective("all_reduce", g)
        j.collective("all_reduce")
    j.collective("all_reduce", tps[0])
    j.collective("all_reduce", tps[1], state="started")
    j.collective("all_reduce", ranks=[0, 1, 2, 3], state="started")
    j.now += 600_000 * MS
    for r in range(8):
        j.set_stacks(r, COMM_STACK)
    j.set_clock_offset(-600_000 * MS + 300 * MS, host=1)
    _teardown(j)
    a = analyse(j, tmp_path)
    assert exit_code(a.findings) == 1, to_text(a)
    assert [f.kind for f in a.findings] == ["stuck"], to_text(a)
