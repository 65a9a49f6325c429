"""The verdict in the job's log and in the DistBackendError: real 3-rank CPU jobs over a real TCPStore, the
ranks' summaries in the store, and the trigger's `frnccl: verdict:` lines checked against
`frnccl analyze --json` on the whole dumps. Summaries a hostile store client wrote are judged too."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dist_harness import RESULT_PREFIX, WORKERS, run_ranks
from fr_backend._native import native
from verdict_lines import TAIL_RE, check_agreement, verdicts

WORLD = 3
WARMUP = 3
PG_TIMEOUT_S = 4
DUMP_TIMEOUT_S = 20
JOB_BOUND_S = PG_TIMEOUT_S + DUMP_TIMEOUT_S + 60
VERDICT_BOUND_MS = 5000  # from the end of the trigger's wait for the writers to the verdict printed
VERDICT_MS_RE = re.compile(r"\] verdict of (\S+) in (\d+) ms \(store reads (\d+) ms, (\d+) summaries\)")


def analyze(path: Path | str, *extra: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "fr_backend.cli", "analyze", str(path), *extra, "--json"],
                          capture_output=True, text=True, timeout=120)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"frnccl analyze --json printed no JSON (rc {proc.returncode}):\n{proc.stdout}{proc.stderr}",
                    pytrace=False)


def marker_line(script: str, marker: str) -> int:
    lines = (WORKERS / script).read_text().splitlines()
    return next(i + 1 for i, ln in enumerate(lines) if marker in ln)


def test_not_joined_verdict_in_log_and_every_error(tmp_path):
    """Rank 1 never joins all_reduce seq 4: the trigger prints the verdict within 5 s of the writers' wait,
    naming rank 1, its host and pid and where its Python is; both victims' DistBackendError carry the verdict
    (the non-trigger's read from the store); the analyzer says the same on the dumps."""
    culprit, victims = 1, [0, 2]
    dump_dir = tmp_path / "dumps"
    job = run_ranks("incident_hang.py", WORLD, "sleep", str(WARMUP), str(culprit), timeout=JOB_BOUND_S,
                    env={"FRNCCL_DUMP_DIR": str(dump_dir), "FRNCCL_DUMP_TIMEOUT_SEC": str(DUMP_TIMEOUT_S),
                         "INCIDENT_PG_TIMEOUT": str(PG_TIMEOUT_S)})
    log = job.describe()
    # The culprit sleeps on: the harness stops it once the victims have failed.
    assert [job.ranks[r].returncode for r in victims] == [1, 1], log
    found = verdicts(log)
    # The trigger prints it once; each victim's error carries its first line once more.
    decided = [v for v in found if v.decided]
    assert decided and len(decided) == len(found), f"want only decided verdicts, got {found}\n{log}"
    v = decided[0]
    assert (v.kind, v.culprits, v.op, v.seq, v.pg, v.desc) == ("not_joined", (culprit,), "all_reduce", WARMUP + 1,
                                                               "0", "default_pg"), f"{v}\n{log}"
    pid = re.search(r"verdict: not_joined: rank 1 \(host [^,]+, pid (\d+)\)", log)
    assert pid, log
    where = f"frnccl: rank {culprit} is at {WORKERS / 'incident_hang.py'}:{marker_line('incident_hang.py', 'STUCK:sleep')} in stuck_sleep"
    assert where in log, f"want {where!r}\n{log}"
    tail = TAIL_RE.search(log)
    assert tail and (tail.group(1), tail.group(2)) == ("3", "3"), log
    assert Path(tail.group(4)).parent == dump_dir and Path(tail.group(4)).is_dir(), tail.group(0)
    # Every victim's raised error carries the verdict line (torch prefixes each line of it with [rankN]:).
    for r in victims:
        out = job.ranks[r].output
        assert re.search(rf"\[rank{r}\]: frnccl: verdict: not_joined: rank {culprit} ", out), f"rank {r}:\n{out}"
    timing = VERDICT_MS_RE.findall(log)
    assert len(timing) == 1, log
    ms = int(timing[0][1])
    print(f"verdict {ms} ms after the writers' wait ended (store reads {timing[0][2]} ms)")
    assert ms <= VERDICT_BOUND_MS, log
    assert int(timing[0][3]) == WORLD, log
    report = analyze(dump_dir)
    assert check_agreement(log, report, undecided_ok=False) is not None


def summary_of(rank: int, world: int, groups: list[dict], **top) -> str:
    return json.dumps({"v": 1, "rank": rank, "world_size": world, "host": f"h{rank}", "pid": 100 + rank,
                       "life": 0, "incident": "inc", "state": "wrote", "groups": groups, "groups_left_out": 0, **top})


def group(enq: int, done: int, in_flight: dict | None = None, name: str = "0", size: int = 3) -> dict:
    g = {"pg": name, "desc": "default_pg", "size": size, "enqueued": {"seq": enq, "op": "all_reduce"},
         "started": {"seq": enq, "op": "all_reduce"}, "completed": {"seq": done, "op": "all_reduce"}, "p2p": [0, 0, 0]}
    if in_flight is not None:
        g["in_flight"] = in_flight
    return g


def op(seq: int, name: str = "all_reduce", shapes: str = "[[4]]", peer: int = -1, p2p: bool = False,
       out: str | None = None, dtypes: str = "Float;Float") -> dict:
    return {"op": name, "seq": seq, "p2p": p2p, "peer": peer, "state": "started", "failed": False, "in": shapes,
            "out": shapes if out is None else out, "dtypes": dtypes, "created_ns": 1_700_000_000_000_000_000 + seq}


def verdict(summaries: list[str | None]) -> tuple[bool, str, list[int], list[str]]:
    return native()._compute_verdict(len(summaries), summaries, "inc", "/d/inc")


def test_verdict_rules_on_summaries():
    """The rules themselves, on summaries as the store would hold them."""
    waiting = [summary_of(r, 3, [group(4, 3, op(4))]) for r in (0, 2)]
    # not_joined: rank 1 issued only up to seq 3, and is inside no op.
    decided, kind, culprits, lines = verdict([waiting[0], summary_of(1, 3, [group(3, 3)], frame="t.py:9 in f"), waiting[1]])
    assert (decided, kind, culprits) == (True, "not_joined", [1]), lines
    assert lines[1] == "frnccl: rank 1 is at t.py:9 in f" and lines[-1].startswith("frnccl: 3/3 ranks wrote"), lines
    # a member with no summary may have skipped it too: it is said, not named; rank 1 still is.
    four = [summary_of(r, 4, [group(4, 3, op(4), size=4)]) for r in (0, 2)]
    decided, kind, culprits, lines = verdict([four[0], summary_of(1, 4, [group(3, 3, size=4)]), four[1], None])
    assert (decided, kind, culprits) == (True, "not_joined", [1]), lines
    assert lines[0].endswith("; rank 3 left no readable summary"), lines
    # size mismatch: the minority is named.
    small = summary_of(1, 3, [group(4, 3, op(4, shapes="[[2]]"))])
    assert verdict([waiting[0], small, waiting[1]])[:3] == (True, "size_mismatch", [1])
    # every member inside the op: stuck, no rank named.
    stuck = verdict([waiting[0], summary_of(1, 3, [group(4, 3, op(4))]), waiting[1]])
    assert stuck[:3] == (False, "", []) and "stuck" in stuck[3][0], stuck
    # a rank with no summary at all: missing_dump names it.
    assert verdict([waiting[0], None, waiting[1]])[:3] == (True, "missing_dump", [1])
    # p2p: rank 0 waits in a recv from rank 1, which posted nothing and is inside no op.
    recv = summary_of(0, 2, [group(2, 2, op(1, "recv", peer=1, p2p=True), size=2)])
    idle = summary_of(1, 2, [group(2, 2, size=2)])
    assert verdict([recv, idle])[:3] == (True, "p2p_unmatched", [1])
    # a tie of two sides names no one.
    tie = verdict([summary_of(0, 2, [group(1, 0, op(1), size=2)]), summary_of(1, 2, [group(1, 0, op(1, "all_gather"), size=2)])])
    assert tie[:3] == (False, "", []), tie


def in_op(rank: int, world: int, o: dict, **top) -> str:
    return summary_of(rank, world, [group(4, 3, o, size=world)], **top)


def idle(rank: int, world: int, **top) -> str:
    return summary_of(rank, world, [group(3, 3, size=world)], **top)


@pytest.mark.parametrize("case", ["gather", "scatter", "all_to_all_single", "all_to_all", "barrier"])
def test_sizes_compared_per_op_family(case):
    """Only the sizes the analyzer compares for the op (analyzer/ops.py family()): gather's outputs exist on the
    root only, scatter's inputs on the root only, all_to_all's sizes differ per rank, a barrier has nothing to
    compare. The rank that never issued the op is named, never the root or an uneven sender."""
    world = 4
    ops = {
        "gather": [op(4, "gather", out="[[4],[4],[4],[4]]")] + [op(4, "gather", out="[]")] * 2,
        "scatter": [op(4, "scatter", shapes="[[4],[4],[4],[4]]", out="[[4]]")] + [op(4, "scatter", shapes="[]", out="[[4]]")] * 2,
        "all_to_all_single": [op(4, "all_to_all_single", shapes=f"[[{r + 1}]]", out=f"[[{7 - r}]]") for r in range(3)],
        "all_to_all": [op(4, "all_to_all", shapes=f"[[{r + 1}],[2],[3],[4]]", out=f"[[{5 - r}],[1],[1],[1]]") for r in range(3)],
        "barrier": [op(4, "barrier", shapes="[[1]]", out="[[0]]"), op(4, "barrier", shapes="[[1]]"), op(4, "barrier", shapes="[[]]")],
    }[case]
    decided, kind, culprits, lines = verdict([in_op(r, world, ops[r]) for r in range(3)] + [idle(3, world)])
    assert (decided, kind, culprits) == (True, "not_joined", [3]), lines


def test_compared_fields_still_mismatch():
    """What the family compares still names the odd rank: a scatter output, a gather input, all_to_all's dtypes."""
    world = 3
    scatter = [op(4, "scatter", shapes="[[4],[4],[4]]", out="[[4]]"), op(4, "scatter", shapes="[]", out="[[2]]"),
               op(4, "scatter", shapes="[]", out="[[4]]")]
    assert verdict([in_op(r, world, scatter[r]) for r in range(3)])[:3] == (True, "size_mismatch", [1])
    gather = [op(4, "gather", out="[[4],[4],[4]]"), op(4, "gather", out="[]"), op(4, "gather", shapes="[[5]]", out="[]")]
    assert verdict([in_op(r, world, gather[r]) for r in range(3)])[:3] == (True, "size_mismatch", [2])
    a2a = [op(4, "all_to_all_single", shapes=f"[[{r + 1}]]", dtypes="Half;Half" if r == 2 else "Float;Float") for r in range(3)]
    assert verdict([in_op(r, world, a2a[r]) for r in range(3)])[:3] == (True, "dtype_mismatch", [2])


def test_truncated_summary_makes_its_rank_unknown():
    """A rank whose summary left groups out (groups_left_out > 0) may be in the group it does not list: it is
    not named missing_dump for it; nor is a rank whose summary was cut to "too_large"."""
    world = 4
    tp = {"name": "tp", "size": 2}
    ranks0 = summary_of(0, world, [dict(group(4, 3, op(4), **tp), ranks=[0, 1])])
    cut1 = summary_of(1, world, [group(3, 3, name=f"g{i}", size=2) for i in range(2)], groups_left_out=5)
    others = [summary_of(r, world, [group(3, 3, size=world)]) for r in (2, 3)]
    decided, kind, culprits, lines = verdict([ranks0, cut1, *others])
    assert not decided and culprits == [], lines
    # the same rank with its whole list (the group not in it) is named: it left no trace of the group.
    whole1 = summary_of(1, world, [group(3, 3, name=f"g{i}", size=2) for i in range(2)])
    assert verdict([ranks0, whole1, *others])[:3] == (True, "missing_dump", [1])
    too_large = json.dumps({"v": 1, "rank": 1, "state": "too_large", "groups": []})
    waiting = [summary_of(r, 3, [group(4, 3, op(4))]) for r in (0, 2)]
    decided, kind, culprits, lines = verdict([waiting[0], too_large, waiting[1]])
    assert not decided and culprits == [], lines


def test_summaries_of_other_jobs_lives_or_incidents_are_not_read():
    """A summary of another job size or incident is unreadable; summaries of different lives, or that disagree
    on a group's members, decide nothing."""
    waiting = [summary_of(r, 3, [group(4, 3, op(4))]) for r in (0, 2)]
    for other in (summary_of(1, 5, [group(3, 3)]), summary_of(1, 3, [group(3, 3)], incident="old")):
        decided, kind, culprits, lines = verdict([waiting[0], other, waiting[1]])
        assert not decided and culprits == [] and "summary of rank 1 unreadable" in lines[0], lines
    decided, kind, culprits, lines = verdict([waiting[0], summary_of(1, 3, [group(3, 3)], life=1), waiting[1]])
    assert not decided and "different lives" in lines[0], lines
    world = 4
    a = summary_of(0, world, [dict(group(4, 3, op(4), name="tp", size=2), ranks=[0, 1])])
    b = summary_of(2, world, [dict(group(3, 3, name="tp", size=2), ranks=[2, 3])])
    decided, kind, culprits, lines = verdict([a, idle(1, world), b, idle(3, world)])
    assert not decided and "disagree on the members" in lines[0], lines


def test_rank_that_left_with_a_stale_op_is_no_wait():
    """A rank that left while its summary still shows an older op in flight does not set where the group stopped."""
    left = summary_of(1, 3, [group(3, 2, op(3))], state="left", incident="")
    waiting = [summary_of(r, 3, [group(4, 3, op(4))]) for r in (0, 2)]
    decided, kind, culprits, lines = verdict([waiting[0], left, waiting[1]])
    assert (decided, kind, culprits) == (True, "missing_dump", [1]), lines
    assert "ranks 0,2 wait in it" in lines[0] and "seq 4" in lines[0], lines


def test_exit_note_names_only_ranks_waited_for():
    """Rule 0 (left_with_exception) names a rank with an exit note only when a peer waits for it in an op it
    never issued; a note on a rank nobody waits for leaves the decision to the other rules. With several
    notes, every such rank is named, the earliest exception first."""
    note = {"exit": "RuntimeError: boom at t.py:3 in f"}
    # rank 3 passed seq 4 and left with a note; rank 2 never issued seq 4: rank 2 is the culprit.
    waiting = [summary_of(r, 4, [group(4, 3, op(4), size=4)]) for r in (0, 1)]
    decided, kind, culprits, lines = verdict([*waiting, summary_of(2, 4, [group(3, 3, size=4)]),
                                              summary_of(3, 4, [group(4, 4, size=4)], **note, exit_time_ns=5)])
    assert (decided, kind, culprits) == (True, "not_joined", [2]), lines
    # nobody waits in any op: the note alone decides nothing.
    unwaited = verdict([summary_of(0, 2, [group(3, 3, size=2)]),
                        summary_of(1, 2, [group(3, 3, size=2)], **note, exit_time_ns=5)])
    assert unwaited[:3] == (False, "", []), unwaited
    # ranks 1 and 2 both left with a note and rank 0 waits for both: both named, rank 2's earlier one first.
    decided, kind, culprits, lines = verdict([
        summary_of(0, 3, [group(4, 3, op(4))]),
        summary_of(1, 3, [group(3, 3)], exit="ValueError: late at t.py:4 in g", exit_time_ns=2_000),
        summary_of(2, 3, [group(3, 3)], **note, exit_time_ns=1_000)])
    assert (decided, kind, culprits) == (True, "left_with_exception", [2, 1]), lines
    assert lines[0].index("RuntimeError: boom") < lines[0].index("ValueError: late") and "rank 0 waited for it" in lines[0], lines


@pytest.mark.parametrize("bad", [
    "not json", "", "{", '{"v":1,"rank":1,"groups":[', '{"v":1,"rank":7,"groups":[]}',  # another rank's
    "[" * 10_000, "[" * 3000,  # too large; within the size bound but past the depth bound
    '{"v":1,"rank":1,"world_size":3,"incident":"inc","groups":[' + "[" * 1000 + "]" * 1000 + "]}", '{"v":1,"rank":1,"groups":[{"pg":"0","in_flight":{"seq":99999999999999999999}}]}',
    "x" * 100_000, '{"v":1,"rank":1,"groups":"no"}', '{"v":1,"rank":1,"host":"\\u001b[31m","groups":[1]}',
])
def test_hostile_summary_is_unreadable_never_blamed(bad):
    """Whatever a store client wrote as rank 1's summary: no crash, 'summary of rank 1 unreadable', and rank 1
    is never named on it (it may have skipped the op, or not)."""
    waiting = [summary_of(r, 3, [group(4, 3, op(4))]) for r in (0, 2)]
    decided, kind, culprits, lines = verdict([waiting[0], bad, waiting[1]])
    assert not decided and culprits == [], lines
    assert "summary of rank 1 unreadable" in lines[0] and lines[0].startswith("frnccl: verdict: undecided: "), lines
    assert all(ln.isprintable() for ln in lines), lines


def test_rank_summary_is_bounded_json():
    """A live summary (what `frnccl status` reuses) is JSON of at most 2 KB even with long names."""
    job = run_ranks("verdict_summary.py", 2, timeout=120, env={"FRNCCL_DUMP_DIR": "/nonexistent-unused"})
    job.assert_ok()
    for r, res in enumerate(job.results()):
        s = res["summary"]
        assert len(s.encode()) <= 2048, len(s)
        d = json.loads(s)
        assert d["rank"] == r and d["state"] == "live" and d["world_size"] == 2, d
        names = [g["pg"] for g in d["groups"]]
        assert names and len(set(names)) == len(names) and len(names) <= 8, d
        assert d["groups_left_out"] + len(d["groups"]) == res["groups"], d
        assert all(len(g["desc"].encode()) <= 51 for g in d["groups"]), d  # 48 bytes and "..."


def test_rank_that_left_is_named_from_its_left_summary(tmp_path):
    """Rank 1 tears down and exits while ranks 0 and 2 enter all_reduce seq 4: it wrote no part, but it posted a
    summary as it left; the verdict names it as the analyzer does (missing_dump) and says it left the job."""
    leaver = 1
    dump_dir = tmp_path / "dumps"
    job = run_ranks("verdict_leaver.py", WORLD, str(WARMUP), str(leaver), timeout=JOB_BOUND_S,
                    env={"FRNCCL_DUMP_DIR": str(dump_dir), "FRNCCL_DUMP_TIMEOUT_SEC": "5",
                         "INCIDENT_PG_TIMEOUT": str(PG_TIMEOUT_S)})
    log = job.describe()
    assert job.ranks[leaver].returncode == 0 and f"rank {leaver} left" in log, log
    found = [v for v in verdicts(log) if v.decided]
    assert found, f"no decided verdict\n{log}"
    assert (found[0].kind, found[0].culprits, found[0].seq) == ("missing_dump", (leaver,), WARMUP + 1), log
    assert re.search(rf"verdict: missing_dump: rank {leaver} \(host [^,]+, pid \d+\).*\(rank {leaver} left the job\)", log), log
    check_agreement(log, analyze(dump_dir), undecided_ok=False)


@pytest.mark.parametrize("mode", ["late", "manual"])
def test_failing_wait_does_not_wait_for_a_verdict(tmp_path, mode):
    """Rank 2 is stopped (SIGSTOP) instead of entering all_reduce: the incident waits for its part up to the dump
    deadline (20 s). "late": the victims' timeout opens a failure incident whose verdict comes only after that
    deadline; their errors follow Gloo's timeout within frnccl's short bound (2.5 s), saying the verdict follows
    in the log (before: held 20 s). "manual": a job-wide dump asked with the dump signal is in progress; the
    victims' failure joins it and a manual dump never gets a verdict, so their errors follow at once."""
    pg_timeout_s = 2
    job = run_ranks("verdict_wait_latency.py", 3, str(pg_timeout_s), mode, timeout=120,
                    env={"FRNCCL_DUMP_DIR": str(tmp_path / "dumps"), "FRNCCL_DUMP_TIMEOUT_SEC": "20"})
    log = job.describe()
    assert [job.ranks[r].returncode for r in (0, 1)] == [0, 0], log
    for rank in (0, 1):
        lines = [ln for ln in job.ranks[rank].output.splitlines() if ln.startswith(RESULT_PREFIX)]
        assert len(lines) == 1, log
        res = json.loads(lines[0][len(RESULT_PREFIX):])
        assert not res["failures"] and "error" in res["notes"], log
        error, past_timeout_s = res["notes"]["error"], res["notes"]["past_timeout_s"]
        assert error.startswith("frnccl: gloo:all_reduce"), log
        # Gloo's own raise comes at the timeout; what frnccl adds is bounded (generous: a loaded machine).
        if mode == "late":
            # The rank whose id the incident bears ("-r<rank>") opened it and prints the verdict itself.
            m = re.search(r"frnccl: incident (\S+-r(\d+)): ", error)
            assert m and past_timeout_s < 4.0, log
            said = ("this rank opened it; its verdict follows in this log" if int(m.group(2)) == rank
                    else "the verdict follows in the log of the rank that opened it")
            assert said in error, log
        else:
            assert "frnccl: verdict:" not in error and past_timeout_s < 1.0, log


def test_log_reader_follows_long_culprit_lists_and_refuses_unknown_lines():
    """The log reader the agreement checks use: a verdict naming more than 12 ranks (",... (N in all)") reads
    back whole, and a line that begins as a verdict in no known form fails rather than passing as none."""
    world = 21
    lines = verdict([summary_of(0, world, [group(4, 3, op(4), size=world)])] + [None] * (world - 1))[3]
    found = verdicts("\n".join(lines))
    assert len(found) == 1 and found[0].decided and found[0].kind == "missing_dump", lines
    assert found[0].culprits == tuple(range(1, 13)) and found[0].culprit_count == world - 1, (found, lines)
    with pytest.raises(AssertionError, match="no known form"):
        verdicts("frnccl: verdict: something new")


@pytest.mark.parametrize("raw, line, named", [
    (b"culprits=1,3\nfrnccl: verdict: not_joined: ranks 1,3", "frnccl: verdict: not_joined: ranks 1,3", [1, 3]),
    (b"culprits=\nfrnccl: verdict: undecided: why", "frnccl: verdict: undecided: why", []),
    (b"frnccl: verdict: written by an older client", "frnccl: verdict: written by an older client", []),
    (b"culprits=4\nx", "x", []),  # not a rank of this job (world 4)
    (b"culprits=1,,2\nx", "x", []),
    (b"culprits=-1\nx", "x", []),
    (b"culprits=1 \nx", "x", []),
    (b"culprits=99999999999999999999999\nx", "x", []),
    (b"culprits=" + b",".join(b"1" for _ in range(65)) + b"\nx", "x", []),  # more than a verdict names
    (b"culprits=2\n\x1b[31mred\nmore", None, [2]),
    (b"culprits=2\nline\n" + b"{" * 9000, "line", [2]),  # JSON text past the bound: dropped, the rest kept
])
def test_verdict_value_from_the_store_is_checked(raw, line, named):
    """What a rank takes from the verdict key: the ranks it names only when every one is a rank of the job and
    the list is well formed and bounded; the line printable, whatever a store client wrote."""
    from fr_backend._native import native

    got_line, got_named, got_json = native()._decode_verdict_value(raw, 4)
    assert len(got_json) <= 8192, len(got_json)
    assert got_named == named, (raw, got_named)
    assert got_line.isprintable() and len(got_line) <= 1024, got_line
    if line is not None:
        assert got_line == line
    value = native()._encode_verdict_value("frnccl: v", [0, 2], '{"kind": "not_joined"}')
    assert native()._decode_verdict_value(value, 4) == ("frnccl: v", [0, 2], b'{"kind": "not_joined"}')


def test_a_failure_outside_collectives_says_what_it_was_and_where_each_rank_was(tmp_path):
    """Rank 1 raises TimeoutError outside any collective (a quorum's timeout); the others wait outside any too.
    No op is pending, so no rank is named, but the verdict says which rank raised what, where, and where the
    others were: not a bare "undecided"."""
    raiser = 1
    dump_dir = tmp_path / "dumps"
    job = run_ranks("outside_collectives.py", WORLD, str(raiser), timeout=JOB_BOUND_S, env={"FRNCCL_DUMP_DIR": str(dump_dir)})
    log = job.describe()
    assert job.ranks[raiser].returncode != 0 and all(job.ranks[r].returncode == 0 for r in range(WORLD) if r != raiser), log
    found = verdicts(log)
    assert len(found) == 1 and not found[0].decided, log
    line = next(ln for ln in log.splitlines() if ln.startswith("frnccl: verdict: undecided: "))
    raised_at = f"{WORKERS / 'outside_collectives.py'}:{marker_line('outside_collectives.py', 'RAISES:quorum')} in wait_for_quorum"
    assert re.search(rf"undecided: rank {raiser} \(host [^,]+, pid \d+\) raised outside collectives: TimeoutError: "
                     rf"quorum not reached within 5 s at {re.escape(raised_at)}", line), line
    assert "no rank is inside a collective or p2p op in its summary, so none is named" in line, line
    waits_at = f"outside_collectives.py:{marker_line('outside_collectives.py', 'WAITS:quorum')} in wait_for_quorum"
    for r in range(WORLD):
        if r != raiser:
            assert re.search(rf"rank {r} at \S*{re.escape(waits_at)}", line), line
    check_agreement(log, analyze(dump_dir), undecided_ok=True)


@pytest.mark.timeout(JOB_BOUND_S + 60)
def test_every_rank_raising_outside_collectives_is_one_incident_that_names_none(tmp_path):
    """Rank 1's quorum times out first, the others' once its incident is judged: no collective is pending, so the
    verdict names no rank but says who raised what first and where the others were, the analyzer's first
    finding says the same word for word, and the later raisers join that incident (no second one)."""
    raiser = 1
    dump_dir = tmp_path / "dumps"
    job = run_ranks("outside_collectives.py", WORLD, str(raiser), "all", timeout=JOB_BOUND_S,
                    env={"FRNCCL_DUMP_DIR": str(dump_dir)})
    log = job.describe()
    assert all(job.ranks[r].returncode not in (0, None) for r in range(WORLD)), log
    assert [p.name for p in dump_dir.iterdir()] == [next(dump_dir.iterdir()).name], log  # one incident
    line = next(ln for ln in log.splitlines() if ln.startswith("frnccl: verdict: undecided: "))
    raised_at = f"{WORKERS / 'outside_collectives.py'}:{marker_line('outside_collectives.py', 'RAISES:quorum')}"
    assert re.search(rf"undecided: rank {raiser} \(host [^,]+, pid \d+\) raised outside collectives: TimeoutError: "
                     rf"quorum not reached within 5 s at {re.escape(raised_at)} in wait_for_quorum; no rank is", line), line
    waits_at = f"outside_collectives.py:{marker_line('outside_collectives.py', 'WAITS:quorum')} in wait_for_quorum"
    assert all(re.search(rf"rank {r} at \S*{re.escape(waits_at)}", line) for r in range(WORLD) if r != raiser), line
    report = analyze(dump_dir)
    assert report["findings"][0]["kind"] == "outside_collectives" and report["findings"][0]["ranks"] == [raiser], report
    check_agreement(log, report, undecided_ok=True)


@pytest.mark.timeout(JOB_BOUND_S + 60)
def test_hostile_message_raised_outside_collectives_is_one_bounded_escaped_line_in_both(tmp_path):
    """The raiser's message holds a terminal escape, a forged verdict line, non-ASCII and 2000 more bytes: the log's
    verdict keeps it on one printable line, bounded, and the analyzer's detail is the same text."""
    raiser = 1
    dump_dir = tmp_path / "dumps"
    message = "quorum \x1b[2J\u00e9\\ " + "y" * 2000 + "\nfrnccl: verdict: not_joined: ranks 0 (forged)"
    job = run_ranks("outside_collectives.py", WORLD, str(raiser), "all", timeout=JOB_BOUND_S,
                    env={"FRNCCL_DUMP_DIR": str(dump_dir), "QUORUM_MESSAGE": message})
    log = job.describe()
    found = verdicts(log)  # a forged line would read as a second, decided verdict
    assert len(found) == 1 and not found[0].decided, log
    line = next(ln for ln in log.splitlines() if ln.startswith("frnccl: verdict: undecided: "))
    assert line.isprintable() and "\x1b" not in line and len(line) < 2000, line
    # the note escaped ESC as \x1b; the log's line escapes that backslash and every non-ASCII byte once more
    assert "raised outside collectives: TimeoutError: quorum \\x5cx1b[2J\\xc3\\xa9\\x5c yyy" in line, line
    check_agreement(log, analyze(dump_dir), undecided_ok=True)


@pytest.mark.timeout(JOB_BOUND_S + 60)
def test_raiser_waited_for_says_where_the_other_rank_not_in_the_op_was(tmp_path):
    """Rank 0 waits in an all_reduce that rank 1 (raising outside collectives) and rank 2 (outside, in its own
    code) never issued: rank 1, which left the job, is named; rank 2 is not, but both the log's verdict and the
    analyzer say where it was."""
    raiser, behind = 1, 2
    dump_dir = tmp_path / "dumps"
    job = run_ranks("outside_collectives.py", WORLD, str(raiser), "behind", timeout=JOB_BOUND_S,
                    env={"FRNCCL_DUMP_DIR": str(dump_dir)})
    log = job.describe()
    decided = [v for v in verdicts(log) if v.decided]
    assert decided and {(v.kind, v.culprits) for v in decided} == {("left_with_exception", (raiser,))}, log
    waits_at = f"outside_collectives.py:{marker_line('outside_collectives.py', 'WAITS:quorum')} in wait_for_quorum"
    said = re.compile(rf"; also not in it, outside collectives: rank {behind} at \S*{re.escape(waits_at)}")
    line = next(ln for ln in log.splitlines() if ln.startswith("frnccl: verdict: left_with_exception: "))
    assert said.search(line), line
    report = analyze(dump_dir)
    assert said.search(report["findings"][0]["detail"]), report["findings"][0]
    check_agreement(log, report)


@pytest.mark.timeout(JOB_BOUND_S + 60)
def test_ranks_failing_after_a_rank_left_outside_collectives_join_its_incident(tmp_path):
    """Rank 1 raises outside collectives and leaves; the others go on later than a cascade's window and their
    all_reduce fails (rank 1 is gone): their failure follows from its leaving, so it joins its incident rather
    than opening one of its own (whose verdict would read as a second fault), and the error they raise and the
    analyzer point at that incident."""
    raiser, dump_timeout_s = 1, 1
    dump_dir = tmp_path / "dumps"
    job = run_ranks("outside_collectives.py", WORLD, str(raiser), "late", timeout=JOB_BOUND_S,
                    env={"FRNCCL_DUMP_DIR": str(dump_dir), "FRNCCL_DUMP_TIMEOUT_SEC": str(dump_timeout_s)})
    log = job.describe()
    assert all(job.ranks[r].returncode not in (0, None) for r in range(WORLD)), log
    victims = [r for r in range(WORLD) if r != raiser]
    assert all("DistBackendError" in job.ranks[r].output for r in victims), log  # they failed in the all_reduce
    incidents = [p.name for p in dump_dir.iterdir()]
    assert len(incidents) == 1 and incidents[0].endswith(f"-exception-r{raiser}"), (incidents, log)
    assert all(f"of this op's group left the job with an uncaught exception in incident {incidents[0]}"
               in job.ranks[r].output for r in victims), log
    assert len(verdicts(log)) == 1, log
    report = analyze(dump_dir)
    assert report["findings"][0]["kind"] == "outside_collectives" and not report["aftershocks"], report
    check_agreement(log, report, undecided_ok=True)


@pytest.mark.timeout(JOB_BOUND_S + 120)
def test_extra_broadcast_in_the_last_step_names_only_its_root(tmp_path):
    """The last step's op pattern differs from the earlier steps: the pair [1, 2] broadcasts once more (root 1)
    before the final world all_reduce, and rank 1 hangs before that broadcast. Rank 2 waits in it for rank 1
    only; ranks 0 and 3 wait in the world all_reduce for both. Rank 2's own history (every earlier step issued
    the world all_reduce right after the pair's broadcast) must not make it a rank that skipped the world
    all_reduce: the analyzer names rank 1 alone, as the log does."""
    world, steps, culprit, peer = 4, 4, 1, 2
    dump_dir = tmp_path / "dumps"
    job = run_ranks("verdict_extra_broadcast.py", world, str(steps), str(culprit), str(peer), timeout=JOB_BOUND_S,
                    env={"FRNCCL_DUMP_DIR": str(dump_dir), "FRNCCL_DUMP_TIMEOUT_SEC": str(DUMP_TIMEOUT_S),
                         "INCIDENT_PG_TIMEOUT": str(PG_TIMEOUT_S)})
    log = job.describe()
    assert f"rank {culprit} stuck before the extra broadcast" in log and "UNEXPECTEDLY" not in log, log
    decided = [v for v in verdicts(log) if v.decided]
    assert decided, f"no decided verdict\n{log}"
    assert {v.culprits for v in decided} == {(culprit,)}, f"{decided}\n{log}"
    report = analyze(dump_dir)
    roots = [f for f in report["findings"] if f["severity"] in ("fault", "suspect")]
    assert roots, json.dumps(report, indent=1)
    named = sorted({r for f in roots for r in f["culprit_ranks"]})
    assert named == [culprit] == list(decided[0].culprits), json.dumps(roots, indent=1)
    check_agreement(log, report, undecided_ok=False)
