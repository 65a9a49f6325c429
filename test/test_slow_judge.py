"""The slow-rank judge's rules on windows of reports built here (fr_backend.slow_judge), and the store line's
parser on what a hostile client may leave under the detector's key. The real jobs are in test_slow_rank.py."""

from __future__ import annotations

import json

import pytest

from fr_backend.slow import parse_report, report_line
from fr_backend.slow_judge import BASELINE_WINDOWS, QUANTILES, GroupReport, RankReport, SlowJudge, finding_line

WINDOW_S = 10.0
OPS = 200  # per group and window: 20 steps a second


def group(name: str, size: int, rank_in_group: int, wait_s: float, spread_s: float = 0.0005,
          ops: int = OPS, overlap: float = 1.0) -> GroupReport:
    """`overlap`: how many of its ops are in flight at once (DDP's buckets): they share the time they wait."""
    qs = tuple(max(0.0, wait_s + spread_s * (q - 0.5)) for q in QUANTILES)
    return GroupReport(name, name, size, rank_in_group, "all_reduce", ops, qs, min(1.0, wait_s * ops / overlap / WINDOW_S))


def flat(world: int, slow: set[int], late_s: float, base_s: float = 0.001) -> list[RankReport]:
    """One world group: every rank waits `late_s` for each slow rank, which waits only `base_s`."""
    out = []
    for r in range(world):
        wait = base_s if r in slow else base_s + late_s
        out.append(RankReport(r, f"h{r}", 100 + r, wait * OPS / WINDOW_S, (group("world", world, r, wait),)))
    return out


def mesh(tp: int, world: int, slow: int, late_s: float, base_s: float = 0.001) -> list[RankReport]:
    """A tp x dp grid: each step an all_reduce in the rank's tp row, then in its dp column. The slow rank's
    row peers wait for it in tp and so reach dp late; the other columns wait for them there; the slow rank's
    own column waits for it in dp."""
    out = []
    slow_row, slow_col = slow // tp, slow % tp
    for r in range(world):
        row, col = r // tp, r % tp
        tp_wait = base_s + (late_s if row == slow_row and r != slow else 0.0)
        late_in_dp = row == slow_row  # the slow rank and its row peers reach dp late
        dp_wait = base_s + (0.0 if late_in_dp else late_s)
        groups = (group(f"tp{row}", tp, col, tp_wait), group(f"dp{col}", world // tp, row, dp_wait))
        out.append(RankReport(r, f"h{r}", 100 + r, (tp_wait + dp_wait) * OPS / WINDOW_S, groups))
    return out


def run(judge: SlowJudge, windows: list[list[RankReport]]) -> list[list[str]]:
    return [[finding_line(f) for f in judge.judge(w, WINDOW_S)] for w in windows]


def healthy(world: int) -> list[RankReport]:
    return flat(world, set(), 0.0)


def test_a_rank_slow_mid_run_is_named_once_then_well_again():
    judge = SlowJudge()
    lines = run(judge, [healthy(4)] * BASELINE_WINDOWS + [flat(4, {2}, 0.015)] * 4 + [healthy(4)] * 3)
    said = [(i, line) for i, window in enumerate(lines) for line in window]
    assert [i for i, _ in said] == [BASELINE_WINDOWS + 1, BASELINE_WINDOWS + 4 + 1], said
    assert said[0][1].startswith("slow: rank 2 (host h2, pid 102) enters world's all_reduce last in ")
    assert "15 ms late on median" in said[0][1] and "lose about 30% of their time" in said[0][1], said[0][1]
    assert said[1][1].startswith("slow: rank 2 (host h2, pid 102) is no longer late"), said[1][1]


@pytest.mark.parametrize("tp,world,slow", [(2, 4, 3), (4, 16, 5)])
def test_in_a_mesh_only_the_slow_rank_is_named_not_its_row_peers(tp, world, slow):
    """Its tp peers reach dp late too, but they waited for it in tp: they wait as long as anyone in all."""
    judge = SlowJudge()
    lines = run(judge, [mesh(tp, world, -1, 0.0)] * BASELINE_WINDOWS + [mesh(tp, world, slow, 0.02)] * 3)
    named = [line for window in lines for line in window]
    assert len(named) == 1 and named[0].startswith(f"slow: rank {slow} "), named


@pytest.mark.parametrize("case", ["all_slow", "late_from_the_start", "one_window", "many_late", "below_bar"])
def test_what_is_the_programs_own_names_no_one(case):
    judge = SlowJudge()
    base = [healthy(16)] * BASELINE_WINDOWS
    if case == "all_slow":  # every rank slowed alike: every rank waits as before
        windows = base + [flat(16, set(), 0.0, base_s=0.004)] * 5
    elif case == "late_from_the_start":  # rank 0's logging, a pipeline stage with more work
        windows = [flat(16, {0}, 0.02)] * (BASELINE_WINDOWS + 5)
    elif case == "one_window":  # one pause, long enough to move one window's median
        windows = base + [flat(16, {3}, 0.05)] + [healthy(16)] * 4
    elif case == "many_late":  # a third of the ranks late alike: the program's shape, not a slow rank
        windows = base + [flat(16, {1, 2, 3, 4, 5}, 0.02)] * 5
    else:  # late, but costing the others 2% of their time
        windows = base + [flat(16, {3}, 0.001)] * 5
    assert run(judge, windows) == [[]] * len(windows)


def test_a_window_some_rank_did_not_report_is_not_judged():
    judge = SlowJudge()
    partial = flat(4, {2}, 0.02)[:3]  # rank 3 said nothing: its part of the comparison is missing
    assert run(judge, [healthy(4)] * BASELINE_WINDOWS + [partial] * 4) == [[]] * (BASELINE_WINDOWS + 4)


def test_a_report_round_trips_through_its_store_line():
    report = flat(4, {2}, 0.01)[2]
    parsed = parse_report(report_line(report).strip())
    assert parsed is not None and (parsed.rank, parsed.host, parsed.pid) == (2, "h2", 102)
    assert parsed.wait_share == pytest.approx(report.wait_share, abs=1e-4)
    assert [(g.name, g.size, g.rank_in_group, g.op, g.ops) for g in parsed.groups] == [("world", 4, 2, "all_reduce", OPS)]
    assert parsed.groups[0].quantiles_s == pytest.approx(report.groups[0].quantiles_s, abs=1e-6)


@pytest.mark.parametrize("line", [
    b"", b"not json", b"[]", b'{"rank": 1}', b"\xff\xfe", b"1" * 10000,
    b'{"rank": -1, "host": "h", "pid": 1, "ws": 0, "g": []}',
    b'{"rank": 1, "host": "h", "pid": 1, "ws": NaN, "g": []}',
    b'{"rank": 1, "host": "h", "pid": 1, "ws": 0, "g": [{"n": "x", "d": "", "s": 2, "r": 0, "o": "o", "c": 5, "q": [1]}]}',
    b'{"rank": 1, "host": "h", "pid": 1, "ws": 0, "g": [{"n": "x", "d": "", "s": 2, "r": 0, "o": "o", "c": 5, "q": '
    + json.dumps([float("inf")] * len(QUANTILES)).encode() + b"}]}",
    b'{"rank": "x", "host": "h", "pid": 1, "ws": 0, "g": []}',
    b'{"rank": 1, "host": "h", "pid": 1, "ws": 0, "g": 5}',
])
def test_a_line_that_is_not_a_report_is_left_out(line):
    assert parse_report(line) is None


def test_names_from_the_store_are_printable_and_cut():
    report = RankReport(1, "h\x1b[2J" + "x" * 500, 7, 0.1, (group("g\n", 2, 1, 0.001),))
    parsed = parse_report(report_line(report).strip())
    assert parsed is not None and parsed.host.isprintable() and len(parsed.host) <= 120
    assert parsed.groups[0].name == "g?"


def test_status_shows_the_detectors_state_slow_ranks_first_and_leaves_out_what_is_not_one():
    from fr_backend.slow import state_value
    from fr_backend.status import Status, parse_lateness, render

    judge = SlowJudge()
    for window in [healthy(4)] * BASELINE_WINDOWS + [flat(4, {2}, 0.015)] * 2:
        judge.judge(window, WINDOW_S)
    late = parse_lateness(state_value(judge, 7, WINDOW_S))
    assert late is not None and late.slow == [2] and late.window_s == WINDOW_S
    text = render(Status(4, {}, 0.1, late))
    assert "slow ranks (named in the job's log): 2" in text, text
    assert "lateness in group world over the last 10 s window" in text and "rank 2 15.0 ms (30%)" in text, text
    for raw in (b"", b"[]", b"{}", b'{"groups": 5}', b"\xff", b'{"groups": {"g": [{"rank": "x"}]}, "slow": "all"}',
                b'{"groups": {"g\\u001b": [{"rank": 1, "late_ms": 1e300, "share": 0.1}]}}'):
        parsed = parse_lateness(raw)
        assert parsed is None or all(not rows or all(isinstance(x["rank"], int) for x in rows) for rows in parsed.groups.values())
        if parsed is not None:
            assert "\x1b" not in render(Status(1, {}, 0.1, parsed))


@pytest.mark.parametrize("values", [[1.0, 2.0], [3.0, 1.0, 2.0], [5.0, 1.0, 1.0, 2.0, 9.0], [0.5] * 6 + [7.0]])
def test_the_others_median_is_the_median_of_the_others(values):
    from statistics import median

    from fr_backend.slow_judge import median_without

    ordered = sorted(values)
    for i, v in enumerate(values):
        assert median_without(ordered, v) == pytest.approx(median(values[:i] + values[i + 1:]))


def test_a_pipeline_stage_late_for_a_slow_stage_is_not_named():
    """PP=2 x DP=2: stage 0 of replica 0 (rank 0) is slow; rank 1, stage 1 of that replica, gets its
    activations late by recv and so reaches its dp all_reduce late too. Only rank 0 ran no p2p... neither did
    it: every stage sends or receives, so none is named where its recv waits are not compared."""
    def window(slow: bool) -> list[RankReport]:
        late = 0.02 if slow else 0.0
        out = []
        for r in range(4):  # dp groups: {0, 2} (stage 0), {1, 3} (stage 1)
            mine_late = r in (0, 1) and slow
            wait = 0.001 if mine_late else 0.001 + late
            out.append(RankReport(r, f"h{r}", r, wait * OPS / WINDOW_S, (group(f"dp{r % 2}", 2, r // 2, wait),), True))
        return out
    judge = SlowJudge()
    assert run(judge, [window(False)] * BASELINE_WINDOWS + [window(True)] * 4) == [[]] * (BASELINE_WINDOWS + 4)


def test_overlapping_ops_late_together_count_once():
    """DDP: 100 bucket all_reduces a window step, all late by the same 2 ms, overlapping: the others lose
    2 ms a step (1%), not 100 x 2 ms. Named only where what they lose passes the bar."""
    def window(late_s: float, steps_per_s: float) -> list[RankReport]:
        ops = int(100 * steps_per_s * WINDOW_S)
        out = []
        for r in range(4):
            wait = 0.001 if r == 2 else 0.001 + late_s
            g = GroupReport("world", "world", 4, r, "all_reduce", ops, tuple(wait for _ in QUANTILES),
                            min(1.0, wait * steps_per_s))  # one wait a step: the buckets overlap
            out.append(RankReport(r, f"h{r}", r, g.busy_share, (g,)))
        return out
    judge = SlowJudge()
    quiet = run(judge, [window(0.0, 3)] * BASELINE_WINDOWS + [window(0.002, 3)] * 4)  # 2 ms a 333 ms step
    assert quiet == [[]] * (BASELINE_WINDOWS + 4)
    judge = SlowJudge()
    loud = run(judge, [window(0.0, 3)] * BASELINE_WINDOWS + [window(0.05, 3)] * 4)  # 50 ms a step: 15%
    named = [line for w in loud for line in w]
    assert len(named) == 1 and named[0].startswith("slow: rank 2 ") and "lose about 15% of their time" in named[0], named


def test_healthy_jitter_over_many_windows_names_no_one():
    """400 windows of 16 ranks whose waits jitter per window, one of them late by design (rank 0 logging)."""
    import random

    rng = random.Random(7)
    judge = SlowJudge()
    said = []
    for _ in range(400):
        window = []
        for r in range(16):
            wait = 0.003 + rng.gauss(0, 0.0004) + (0.0 if r == 0 else 0.02 + rng.gauss(0, 0.002))
            wait = max(0.0, wait)
            window.append(RankReport(r, f"h{r}", r, wait * OPS / WINDOW_S, (group("world", 16, r, wait),)))
        said += [finding_line(f) for f in judge.judge(window, WINDOW_S)]
    assert said == []


def test_a_streak_needs_windows_in_a_row():
    judge = SlowJudge()
    base = [healthy(4)] * BASELINE_WINDOWS
    for i, w in enumerate(base):
        judge.judge(w, WINDOW_S, i)
    assert judge.judge(flat(4, {2}, 0.015), WINDOW_S, 10) == []
    assert judge.judge(flat(4, {2}, 0.015), WINDOW_S, 20) == []  # ten windows later: not a streak
    assert [f.rank for f in judge.judge(flat(4, {2}, 0.015), WINDOW_S, 21)] == [2]
