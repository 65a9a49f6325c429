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

from dist_harness import WORKERS, run_ranks
from fr_backend._native import native
from verdict_lines import TAIL_RE, check_agreement, verdicts

WORLD = 3
WARMUP = 3
PG_TIMEOUT_S = 4
DUMP_TIMEOUT_S = 20
JOB_BOUND_S = PG_TIMEOUT_S + DUMP_TIMEOUT_S + 60
VERDICT_BOUND_MS = 5000  # from the end of the trigger's wait for the writers to the verdict printed
VERDICT_MS_RE = re.compile(r"\] verdict of (\S+) in (\d+) ms \(store reads (\d+) ms, (\d+) summaries\)")


def analyze(path: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "fr_backend.cli", "analyze", str(path), "--json"],
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
                       "life": 0, "incident": "i", "state": "wrote", "groups": groups, "groups_left_out": 0, **top})


def group(enq: int, done: int, in_flight: dict | None = None, name: str = "0", size: int = 3) -> dict:
    g = {"pg": name, "desc": "default_pg", "size": size, "enqueued": {"seq": enq, "op": "all_reduce"},
         "started": {"seq": enq, "op": "all_reduce"}, "completed": {"seq": done, "op": "all_reduce"}, "p2p": [0, 0, 0]}
    if in_flight is not None:
        g["in_flight"] = in_flight
    return g


def op(seq: int, name: str = "all_reduce", shapes: str = "[[4]]", peer: int = -1, p2p: bool = False) -> dict:
    return {"op": name, "seq": seq, "p2p": p2p, "peer": peer, "state": "started", "failed": False, "in": shapes,
            "out": shapes, "dtypes": "Float;Float", "created_ns": 1_700_000_000_000_000_000 + seq}


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
    idle = verdict([summary_of(0, 2, [group(3, 3, size=2)]), summary_of(1, 2, [group(3, 3, size=2)], **note, exit_time_ns=5)])
    assert idle[:3] == (False, "", []), idle
    # ranks 1 and 2 both left with a note and rank 0 waits for both: both named, rank 2's earlier one first.
    decided, kind, culprits, lines = verdict([
        summary_of(0, 3, [group(4, 3, op(4))]),
        summary_of(1, 3, [group(3, 3)], exit="ValueError: late at t.py:4 in g", exit_time_ns=2_000),
        summary_of(2, 3, [group(3, 3)], **note, exit_time_ns=1_000)])
    assert (decided, kind, culprits) == (True, "left_with_exception", [2, 1]), lines
    assert lines[0].index("RuntimeError: boom") < lines[0].index("ValueError: late") and "rank 0 waited for it" in lines[0], lines


@pytest.mark.parametrize("bad", [
    "not json", "", "{", '{"v":1,"rank":1,"groups":[', '{"v":1,"rank":7,"groups":[]}',  # another rank's
    "[" * 10_000, '{"v":1,"rank":1,"groups":[{"pg":"0","in_flight":{"seq":99999999999999999999}}]}',
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
