"""Early exit to a closing collective (issue #45, item 2): real 4-rank CPU jobs on a 2x2 DeviceMesh, one rank runs
out of data, leaves the loop and enters the job's closing world op while its tp and dp peers wait for it in the next
step's all_reduces. The log's verdict and `frnccl analyze` both name it, saying it left the loop early, and agree;
where two ranks leave together neither names a rank."""

from __future__ import annotations

import json
import re

import pytest

from dist_harness import run_ranks
from test_verdict import DUMP_TIMEOUT_S, JOB_BOUND_S, PG_TIMEOUT_S, analyze, op, summary_of, verdict
from verdict_lines import check_agreement, verdicts

WORLD = 4
STEPS = 4


def run_job(tmp_path, closing: str, leavers: dict[int, int]):
    dump_dir = tmp_path / "dumps"
    job = run_ranks("verdict_early_exit.py", WORLD, str(STEPS), closing, *(f"{r}:{n}" for r, n in leavers.items()),
                    timeout=JOB_BOUND_S, env={"FRNCCL_DUMP_DIR": str(dump_dir),
                                              "FRNCCL_DUMP_TIMEOUT_SEC": str(DUMP_TIMEOUT_S),
                                              "INCIDENT_PG_TIMEOUT": str(PG_TIMEOUT_S)})
    log = job.describe()
    for r in leavers:
        assert f"rank {r} ran out of data and enters the closing {closing}" in log, log
    assert "UNEXPECTEDLY" not in log and all(x.returncode != 0 for x in job.ranks), log
    return log, analyze(dump_dir)


@pytest.mark.timeout(JOB_BOUND_S + 120)
@pytest.mark.parametrize("closing, leaver", [("barrier", 3), ("all_reduce", 3), ("barrier", 0)])
def test_rank_that_left_the_loop_early_is_named(tmp_path, closing, leaver):
    """The leaver ran STEPS - 1 steps: its tp peer waits for it in tp all_reduce seq STEPS, its dp peer in dp
    all_reduce seq STEPS, and the fourth rank waits for the tp peer in its own dp all_reduce; the leaver is alone in
    the world op. The named op is its tp group's all_reduce (it holds up two ranks: the tp peer, and the rank waiting
    on that peer); the line says which op the leaver is in and which ops its peers wait for it in."""
    log, report = run_job(tmp_path, closing, {leaver: STEPS - 1})
    decided = [v for v in verdicts(log) if v.decided]
    assert decided, log
    v = decided[0]
    assert (v.kind, v.culprits, v.op, v.seq, v.desc) == ("left_early", (leaver,), "all_reduce", STEPS, "mesh_tp"), \
        f"{v}\n{log}"
    line = next(ln for ln in log.splitlines() if ln.startswith("frnccl: verdict: left_early: "))
    tp_peer, dp_peer = leaver ^ 1, leaver ^ 2  # mesh [[0, 1], [2, 3]]: tp groups are rows, dp groups columns
    assert re.search(rf"left the loop early: it is in {closing} seq \d+ of group \S+ \([^)]*\), which no other "
                     rf"member reached, while its peers wait for it in ops it never issued: rank {tp_peer} in "
                     rf"all_reduce seq {STEPS} of group {v.pg} \(mesh_tp\), rank {dp_peer} in all_reduce seq {STEPS} "
                     rf"of group \S+ \(mesh_dp\); rank {leaver ^ 3} waits on them through other groups", line), line
    f = report["findings"][0]
    assert (f["kind"], f["culprit_ranks"], f["victim_ranks"]) == (
        "left_early", [leaver], sorted(set(range(WORLD)) - {leaver})), json.dumps(report["findings"], indent=1)
    assert f"rank {leaver} left the loop early: it is in {closing}" in f["detail"], f["detail"]
    faults = [x for x in report["findings"] if x["severity"] in ("fault", "suspect")]
    assert [x["culprit_ranks"] for x in faults] == [[leaver]], json.dumps(faults, indent=1)
    check_agreement(log, report, undecided_ok=False)


@pytest.mark.timeout(JOB_BOUND_S + 120)
def test_two_ranks_that_left_together_name_no_rank(tmp_path):
    """Ranks 0 and 3 both run out of data a step early and wait together in the closing barrier; ranks 1 and 2 wait
    for them in their tp all_reduces. Two against two: which side left early the dumps cannot tell, so the log says
    undecided and the analyzer names no rank alone (a deadlock of the whole cycle)."""
    log, report = run_job(tmp_path, "barrier", {0: STEPS - 1, 3: STEPS - 1})
    found = verdicts(log)
    assert found and not any(v.decided for v in found), log
    faults = [x for x in report["findings"] if x["severity"] in ("fault", "suspect")]
    assert faults and faults[0]["kind"] == "deadlock" and faults[0]["culprit_ranks"] == list(range(WORLD)), \
        json.dumps(faults, indent=1)
    assert not any(x["kind"] == "left_early" for x in report["findings"]), json.dumps(report["findings"], indent=1)
    check_agreement(log, report, undecided_ok=True)


def grp(name: str, desc: str, ranks: list[int], enq: int, done: int, in_flight: dict | None = None) -> dict:
    g = {"pg": name, "desc": desc, "size": len(ranks), "ranks": ranks, "enqueued": {"seq": enq, "op": "all_reduce"},
         "completed": {"seq": done, "op": "all_reduce"}, "p2p": [0, 0, 0]}
    if in_flight is not None:
        g["in_flight"] = in_flight
    return g


def mesh_summaries(leavers: set[int]) -> list[str | None]:
    """The store summaries of a 2x2 mesh after STEPS steps whose ``leavers`` entered the closing world barrier, as
    the ranks post them (each group's in_flight: the op a rank is inside)."""
    tp = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
    dp = {0: [0, 2], 2: [0, 2], 1: [1, 3], 3: [1, 3]}
    tp_done = {r for r in range(WORLD) if not set(tp[r]) & leavers}
    out: list[str | None] = []
    for r in range(WORLD):
        if r in leavers:
            groups = [grp("0", "default_pg", list(range(WORLD)), 1, 0, op(1, "barrier")),
                      grp(f"t{tp[r][0]}", "mesh_tp", tp[r], STEPS, STEPS),
                      grp(f"d{dp[r][0]}", "mesh_dp", dp[r], STEPS, STEPS)]
        elif r not in tp_done:
            groups = [grp("0", "default_pg", list(range(WORLD)), 0, 0),
                      grp(f"t{tp[r][0]}", "mesh_tp", tp[r], STEPS + 1, STEPS, op(STEPS + 1)),
                      grp(f"d{dp[r][0]}", "mesh_dp", dp[r], STEPS, STEPS)]
        else:
            groups = [grp("0", "default_pg", list(range(WORLD)), 0, 0),
                      grp(f"t{tp[r][0]}", "mesh_tp", tp[r], STEPS + 1, STEPS + 1),
                      grp(f"d{dp[r][0]}", "mesh_dp", dp[r], STEPS + 1, STEPS, op(STEPS + 1))]
        out.append(summary_of(r, WORLD, groups))
    return out


def test_log_rule_on_summaries_names_one_leaver_and_refuses_the_rest():
    """The log's rule itself on summaries: one leaver is named, with the op of its tp peer's wait; two leavers, a
    member without a summary, or a pair (one against one) name no rank as having left early."""
    decided, kind, culprits, lines = verdict(mesh_summaries({3}))
    assert (decided, kind, culprits) == (True, "left_early", [3]), lines
    assert "op all_reduce seq 5, group t2 (mesh_tp); left the loop early: it is in barrier seq 1 of group 0" in lines[0]
    assert verdict(mesh_summaries({0, 3}))[:3] == (False, "", []), "two leavers"
    summaries = mesh_summaries({3})
    summaries[0] = None  # rank 0 (waiting on rank 2) posted nothing: missing_dump's, not this rule's
    assert verdict(summaries)[1] != "left_early"
    world = [0, 1]
    pair = [summary_of(0, 2, [grp("0", "default_pg", world, 0, 0), grp("p", "pair", world, STEPS + 1, STEPS, op(STEPS + 1))]),
            summary_of(1, 2, [grp("0", "default_pg", world, 1, 0, op(1, "barrier")), grp("p", "pair", world, STEPS, STEPS)])]
    assert verdict(pair)[:3] == (False, "", []), "one against one"
