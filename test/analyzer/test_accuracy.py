"""Shapes of multi-host jobs that a verdict must get right: host clock offsets, a rank that skips a
collective and goes on, an async send whose peer hangs in compute; and the evidence of findings."""

import json
import pickle

import pytest
from conftest import analyse, faults

from fr_backend.analyzer import synth
from fr_backend.analyzer.report import exit_code, run, to_json, to_text
from fr_backend.analyzer.synth import MS, Job

SIZES = [16, 64]


def innocent_blamed(a, culprits) -> list[tuple[str, list[int]]]:
    """Fault and straggler findings that name a rank other than the culprits."""
    return [(f.kind, f.culprit_ranks) for f in a.findings
            if (f.is_fault or f.kind == "straggler") and set(f.culprit_ranks) - set(culprits)]


# --------------------------------------------------------------------------- clocks


@pytest.mark.parametrize("n", SIZES)
def test_healthy_job_with_host_clock_offsets_exits_0(tmp_path, n):
    """Every host's clock off by a different amount within +-5 ms, nothing slow: no finding, exit 0."""
    j, _ = synth.healthy_mesh(n, offset_ms=5.0)
    a = analyse(j, tmp_path)
    assert [f.kind for f in a.findings] == [], to_text(a)
    assert exit_code(a.findings) == 0


@pytest.mark.parametrize("n", SIZES)
def test_host_clock_offsets_are_reported_in_the_json(tmp_path, n):
    j, _ = synth.healthy_mesh(n, offset_ms=5.0)
    clock = json.loads(json.dumps(to_json(analyse(j, tmp_path))))["clock"]
    hosts = {h["host"]: h for h in clock["hosts"]}
    assert clock["reference_host"] == "host0" and len(hosts) == n // j.ranks_per_host
    ref = j.clock_offset.get(0, 0)
    for h, got in hosts.items():
        want = j.clock_offset.get(got["ranks"][0], 0) - ref
        assert got["uncertainty_ns"] is not None and got["samples"] > 0, got
        assert abs(got["offset_ns"] - want) <= max(3 * got["uncertainty_ns"], 50_000), (h, got, want)
        assert got["ranks"] == [r for r in range(n) if j.host(r) == h]
    assert any(abs(h["offset_ns"]) >= 4 * MS for h in hosts.values())  # the +-5 ms were seen, and corrected


def test_merged_trace_is_on_one_clock(tmp_path):
    """The same collective starts at the same time on every rank of the merged trace, whatever the host clocks."""
    from fr_backend.analyzer.trace import build_trace

    j, _ = synth.healthy_mesh(16, offset_ms=5.0)
    ts: dict[int, float] = {}
    for e in build_trace(analyse(j, tmp_path))["traceEvents"]:
        if e.get("ph") == "X" and e["args"].get("seq") == 40 and e["name"] == "all_reduce" and e["tid"] == 1:
            ts[e["pid"]] = e["ts"]
    assert len(ts) == 16 and max(ts.values()) - min(ts.values()) < 300, ts  # the 200 us of jitter, not 10 ms


def test_per_rank_clocks_of_torch_dumps_are_estimated(tmp_path):
    """torch's dumps have no hostname: each rank is taken to have its own clock, and it is still corrected."""
    j, _ = synth.healthy_mesh(16, offset_ms=5.0)
    for r in range(16):
        j.set_clock_offset(((r * 5) % 11 - 5) * MS, rank=r)
    a = analyse(j, tmp_path, "torch")
    assert faults(a) == [] and [f.kind for f in a.findings] == [], to_text(a)
    assert len(a.match.clocks.hosts) == 16


def slow_pair_b(end_lag: dict[int, int], steps: int = 24) -> Job:
    """The shape of test_real_jobs' slow_pair on one host: pairs A {0,1} and B {2,3}, then the world, each step;
    rank 2 reaches B's all_reduce 50 ms late every step. ``end_lag``: how late each rank's watchdog sees the ends."""
    j = Job(4, backend="gloo", step_ns=100 * MS)
    a, b = j.new_pg("1", [0, 1], "pair_a"), j.new_pg("2", [2, 3], "pair_b")
    j.end_lag.update(end_lag)
    for _ in range(steps):
        j.collective(pg=a, sizes=[[8]])
        j.collective(pg=b, sizes=[[8]], delay_ns={2: 50 * MS})
        j.collective(sizes=[[4]])
    return j


def test_ranks_of_one_kernel_share_its_clock_whatever_their_observed_ends_say(tmp_path):
    """On CPU groups an op's end is when each rank's watchdog poll saw it, and the poll's phase differs per rank by
    up to its 10 ms period. CI's loaded machine once made this shape's ends say rank 1's clock was 5 ms ahead of
    rank 0's on their one host; corrected by it, rank 0 became a straggler of pair A. Dumps of one kernel (the same
    boot moment on the wall clock) share its clock: the only straggler is rank 2, and no rank is corrected."""
    a = analyse(slow_pair_b({1: 8 * MS, 2: 20 * MS, 3: 8 * MS}), tmp_path)
    got = [(f.culprit_ranks, f.pg_desc) for f in a.findings if f.kind == "straggler"]
    assert got == [([2], "pair_b")], to_text(a)
    assert [f for f in a.findings if f.is_fault] == [], to_text(a)
    (host,) = a.match.clocks.hosts
    assert host.rank_offsets_ns is None and a.match.clocks.offset == {}, to_json(a)["clock"]
    assert "offsets differ" not in to_text(a, clocks=True)


def test_a_rank_of_another_kernel_under_the_same_hostname_keeps_its_own_clock(tmp_path):
    """A hostname shared by containers of two machines: rank 3's dumps show another boot moment and a wall clock
    300 ms ahead. It is corrected by its own offset, so nobody is a straggler for it, and the report says the
    host's ranks' offsets differ."""
    j = slow_pair_b({})
    j.set_clock_offset(300 * MS, rank=3)
    a = analyse(j, tmp_path)
    got = [(f.culprit_ranks, f.pg_desc) for f in a.findings if f.kind == "straggler"]
    assert got == [([2], "pair_b")], to_text(a)
    (host,) = a.match.clocks.hosts
    assert host.rank_offsets_ns is not None and abs(host.rank_offsets_ns[3] - 300 * MS) < MS, to_json(a)["clock"]
    assert "offsets differ" in to_text(a, clocks=True)


def test_clock_offsets_of_one_host_are_shown_only_when_asked(tmp_path, capsys):
    """The demo's job runs on one host, and its report ended with a "Host clocks" section ("vm: its ranks'
    offsets differ: +0.000 to +5.959 ms") that changed nothing in the verdict: it is printed with -v only, and
    is always in --json."""
    from fr_backend.analyzer.cli import main

    j, _ = synth.healthy_mesh(16, offset_ms=0.0)
    j.ranks_per_host = 16
    j.set_clock_offset(6 * MS, rank=5)
    j.collective(ranks=[r for r in range(16) if r != 3], state="started")  # rank 3 never joins: a verdict
    path = str(j.write(tmp_path / "dumps"))
    assert main([path]) == 1
    plain = capsys.readouterr().out
    assert "ROOT CAUSE: rank 3 - not_joined" in plain and "Host clocks" not in plain, plain
    assert main([path, "-v"]) == 1
    verbose = capsys.readouterr().out
    assert "Host clocks" in verbose and "offsets differ" in verbose, verbose
    added = [ln for ln in verbose.splitlines() if ln and ln not in plain.splitlines()]
    assert added[0].startswith("Host clocks") and all(ln.startswith("- ") for ln in added[1:]), added
    assert main([path, "--json"]) == 1
    (host,) = json.loads(capsys.readouterr().out)["clock"]["hosts"]
    assert host["ranks_share_a_clock"] is False and host["rank_offsets_ns"]["5"] > 0, host


def test_dumps_of_one_host_shifted_per_rank_are_corrected_per_rank(tmp_path):
    """One host (one hostname), each rank's dump shifted by its own offset within +-5 ms, as a test does to
    mimic a multi-host job: the ranks do not share a clock after all, each is corrected by its own offset."""
    j, _ = synth.healthy_mesh(16, offset_ms=0.0)
    j.ranks_per_host = 16
    for r in range(16):
        j.set_clock_offset(((r * 7) % 11 - 5) * MS, rank=r)
    a = analyse(j, tmp_path)
    assert [f.kind for f in a.findings] == [], to_text(a)
    (host,) = to_json(a)["clock"]["hosts"]
    assert host["host"] == "host0" and host["ranks_share_a_clock"] is False
    for r, got in host["rank_offsets_ns"].items():
        assert abs(got - (j.clock_offset[int(r)] - j.clock_offset[0])) <= 50_000, (r, got)


@pytest.mark.parametrize("n", SIZES)
def test_real_straggler_survives_the_correction_and_is_performance(tmp_path, n):
    """A rank 5 ms late at every TP all_reduce, host clocks off by +-5 ms: one straggler finding naming it,
    severity performance, exit 0, never the root cause."""
    slow = n // 2 + 1
    j, _ = synth.straggler_mesh(n, slow)
    a = analyse(j, tmp_path)
    assert [(f.kind, f.culprit_ranks, f.severity) for f in a.findings] == [("straggler", [slow], "performance")]
    assert exit_code(a.findings) == 0
    text = to_text(a)
    assert "ROOT CAUSE" not in text and "Performance (not a fault)" in text
    # the offsets the straggler's arrivals were corrected by are part of its verdict: shown without -v
    assert "Host clocks" in text, text


def test_cli_exits_0_on_a_straggler_alone(tmp_path, capsys):
    from fr_backend.analyzer.cli import main

    j, _ = synth.straggler_mesh(16, 9)
    path = j.write(tmp_path / "dumps")
    assert main([str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(f["kind"], f["severity"], f["culprit_ranks"]) for f in out["findings"]] == [
        ("straggler", "performance", [9])]
    # and a fault still exits 1
    j.collective(ranks=[r for r in range(16) if r != 3], state="started")
    assert main([str(j.write(tmp_path / "dumps2"))]) == 1


def test_lateness_within_the_clock_uncertainty_is_not_a_straggler(tmp_path):
    """Hosts' completion discovery noisy by up to 4 ms: the offsets are uncertain, and a rank 1.5 ms late
    across hosts is not reported."""
    import random

    rng = random.Random(1)
    j = Job(16, ranks_per_host=4, step_ns=20 * MS)
    for _ in range(40):
        j.collective(delay_ns={5: int(1.5 * MS)})
    for st in j.ranks:
        for e in st.entries:
            e["time_discovered_completed_ns"] += rng.randrange(4 * MS)
            e["time_gpu_completed_ns"] = 0
    a = analyse(j, tmp_path)
    assert faults(a) == [] and [f.kind for f in a.findings] == [], to_text(a)


def test_pair_members_last_by_turns_are_not_stragglers(tmp_path):
    """In a pair, each member is last in half the collectives by chance: 2 ms of jitter taking turns is not a
    straggler (it takes three quarters of a pair's collectives)."""
    j = Job(4, step_ns=20 * MS)
    pair = j.new_pg("1", [0, 1], "tp")
    for i in range(40):
        j.collective(pg=pair, delay_ns={i % 2: 2 * MS})
    a = analyse(j, tmp_path)
    assert [f.kind for f in a.findings] == [], to_text(a)
    j = Job(4, step_ns=20 * MS)  # one rank last in 3 of 4: reported
    pair = j.new_pg("1", [0, 1], "tp")
    for i in range(40):
        j.collective(pg=pair, delay_ns={1 if i % 4 else 0: 2 * MS})
    a = analyse(j, tmp_path / "2")
    assert [(f.kind, f.culprit_ranks) for f in a.findings] == [("straggler", [1])], to_text(a)


def test_old_dump_with_store_offset_is_read(tmp_path):
    """Dumps before 3.1 carry clock.store_offset_ns (always 0); a set one is still subtracted."""
    j = Job(4)
    for _ in range(5):
        j.collective()
    j.collective(ranks=[0, 1, 2], state="started")
    inc = tmp_path / "20260101-000000-timeout-0" / "pickle"
    inc.mkdir(parents=True)
    for r in range(4):
        d = j.dump(r)
        d["clock"]["store_offset_ns"] = 7 * MS if r == 1 else 0
        (inc / f"frnccl_rank_{r}").write_bytes(pickle.dumps(d, protocol=2))
    a = run([str(inc.parent)], jobs=1)
    assert [(f.kind, f.culprit_ranks) for f in faults(a)] == [("not_joined", [3])]
    created = {r: a.res.ranks[r].pgs["0"].c_created[0] for r in range(4)}
    assert created[0] - created[1] == 7 * MS


# --------------------------------------------------------------------------- skip and go on


@pytest.mark.parametrize("n", SIZES)
def test_rank_that_skips_a_tp_collective_and_goes_on_is_named(tmp_path, n):
    """TP x DP mesh; rank `bad` skips one TP all_reduce, its DP group completes, it waits in the world
    all_reduce: the waits form a cycle, and the program order names `bad`, not every rank."""
    bad = n - 3
    j, _ = synth.mesh_skip(n, bad)
    a = analyse(j, tmp_path)
    fs = faults(a)
    f = fs[0]
    tp = f"{1 + bad // 4}"
    assert (f.kind, f.culprit_ranks, f.pg, f.collective_seq_id) == ("not_joined", [bad], tp, 21), to_text(a)
    assert f"rank {bad} issued all_reduce on pg " in f.detail and "(mesh_dp) seq 21 without the all_reduce on pg " \
        f"{tp} (mesh_tp) seq 21 that every other rank" in f.detail, f.detail
    assert f.victims == [r for r in range(n) if r != bad]
    assert innocent_blamed(a, [bad]) == [] and "deadlock" not in [x.kind for x in a.findings]


def test_skip_and_go_on_in_a_2x2_mesh(tmp_path):
    j, _ = synth.mesh_skip(4, 3, tp=2)
    a = analyse(j, tmp_path)
    assert [(f.kind, f.culprit_ranks) for f in faults(a)] == [("not_joined", [3])], to_text(a)


def test_opposite_orders_on_purpose_stay_a_deadlock(tmp_path):
    """Two partitions of 4 ranks, x = {0,2},{1,3} and y = {0,3},{1,2}; ranks 0,1 issue their x all_reduce
    first, ranks 2,3 their y all_reduce: a cycle that no single rank's deviation explains (each half did
    what the other half of its role did), so it stays a deadlock of all of them."""
    j = Job(4)
    xs = [j.new_pg("1", [0, 2], "x"), j.new_pg("2", [1, 3], "x")]
    ys = [j.new_pg("3", [0, 3], "y"), j.new_pg("4", [1, 2], "y")]
    for _ in range(5):
        for g in xs + ys:
            j.collective(pg=g)
    for g in xs:
        j.collective(pg=g, ranks=[r for r in g.ranks if r < 2], state="started")
    for g in ys:
        j.collective(pg=g, ranks=[r for r in g.ranks if r >= 2], state="started")
    a = analyse(j, tmp_path)
    assert [(f.kind, f.culprit_ranks) for f in faults(a)] == [("deadlock", [0, 1, 2, 3])], to_text(a)


# --------------------------------------------------------------------------- async p2p


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("bad_isend", [True, False])
def test_async_send_whose_peer_hangs_in_compute_names_the_peer(tmp_path, n, bad_isend):
    """A stage posts an isend and goes on to the all_reduce; its peer hangs in compute before the recv (with an
    isend of its own pending, or nothing): the peer is named, not the sender, not a deadlock."""
    bad = 5
    j, _ = synth.pipeline_async(n, bad, bad_isend=bad_isend)
    a = analyse(j, tmp_path)
    f = faults(a)[0]
    assert f.culprit_ranks == [bad] and f.kind in ("p2p_unmatched", "not_joined"), to_text(a)
    assert innocent_blamed(a, [bad]) == [] and "deadlock" not in [x.kind for x in a.findings]
    assert any("asynchronously" in e for e in f.evidence) == bad_isend


def test_async_peer_with_an_elastic_helper_thread_is_still_named(tmp_path):
    """A thread of torch.distributed.elastic (not communication) in the stacks does not hide that the rank
    is in compute."""
    j, _ = synth.pipeline_async(16, 5)
    j.set_stacks(5, synth.COMPUTE_STACK + 'Thread 0x7f0000000002 (most recent call first):\n  File "/env/lib/python3.11/'
                 'site-packages/torch/distributed/elastic/timer/api.py", line 80 in _reap_worker_loop\n')
    assert faults(analyse(j, tmp_path))[0].culprit_ranks == [5]


def test_async_peer_without_stacks_is_not_guessed(tmp_path):
    """Without thread stacks nothing tells an isend from a blocking send: the cycle stays a deadlock."""
    j, _ = synth.pipeline_async(16, 5)
    j.set_stacks(5, "")
    assert faults(analyse(j, tmp_path))[0].kind == "deadlock"


# --------------------------------------------------------------------------- evidence of findings


def test_size_mismatch_has_its_caller_and_the_waiting_ranks(tmp_path):
    j = Job(8)
    for _ in range(5):
        j.collective()
    j.collective(sizes=[[4, 4]], sizes_by_rank={3: [[5, 5]]}, out_sizes_by_rank={3: [[5, 5]]}, state="started")
    j.ranks[3].entries[-1]["frames"] = [{"name": "shard_grads", "filename": "/job/fsdp.py", "line": 77}]
    f = faults(analyse(j, tmp_path))[0]
    assert (f.kind, f.culprit_ranks) == ("size_mismatch", [3])
    assert f.victims == [0, 1, 2, 4, 5, 6, 7]
    assert any("rank 3 on host0 pid 1003" in e and "called from shard_grads (/job/fsdp.py:77)" in e
               for e in f.evidence), f.evidence
    assert any("ranks 0-2,4-7 wait in it" in e for e in f.evidence), f.evidence


def _retire_last(j: Job, ranks) -> None:
    """frnccl's dumps of an op that failed (or timed out): retired, never completed."""
    for r in ranks:
        j.ranks[r].entries[-1]["retired"] = True


def test_failed_op_of_frnccl_dumps_is_not_a_gloo_state_note(tmp_path):
    """The op that timed out on rank 3 is retired but not completed in frnccl's own dump: no note about torch's
    gloo, its state kept (not rewritten), and rank 3 is said to have failed in it, not to wait in it."""
    j = Job(8)
    for _ in range(5):
        j.collective()
    j.collective(state="started")
    _retire_last(j, [3])
    a = analyse(j, tmp_path)
    assert a.res.notes == []
    rp = a.res.ranks[3].pgs["0"]
    assert rp.c_state[rp.slot(6)] == 1 and rp.failed == {6}  # started, as dumped
    f = faults(a)[0]
    assert f.kind == "stuck" and "on rank 3 it failed" in f.detail and "ranks 0-2,4-7 are still inside" in f.detail


def test_ranks_whose_op_failed_are_not_said_to_wait_in_it(tmp_path):
    """Rank 3 died; the others' all_reduce failed (retired, not completed): they are not 'waiting in' it."""
    j = Job(4)
    for _ in range(5):
        j.collective()
    j.collective(ranks=[0, 1, 2], state="started")
    _retire_last(j, [0, 1, 2])
    a = analyse(j, tmp_path, ranks=[0, 1, 2])
    f = faults(a)[0]
    assert (f.kind, f.culprit_ranks) == ("missing_dump", [3])
    assert "wait in" not in f.detail and "failed, waiting for rank 3" in f.detail, f.detail
