"""A rank that leaves the job with an uncaught Python exception writes its part first: the exception (type,
message, innermost user frame, a short traceback) is in its dump and in the job-wide incident it opens on its
way out, which its peers' parts join, and `frnccl analyze` names it as the root cause. The user's own
sys.excepthook and torch elastic's @record keep working; a healthy job's exit gets nothing added.

Real 4-rank CPU jobs over env:// (the store hosted by rank 0), each with a hard time bound.
"""

from __future__ import annotations

import ast
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dist_harness import WORKERS, Job, run_ranks
from test_incidents import analyze, hang_env, incident_dirs, load_incident, marker_line, only_incident, wrote_lines
from verdict_lines import check_agreement

WORLD = 4
STEPS = 6  # the raiser fails in forward at this step; the others wait in its all_reduce
RAISER = 2
OTHERS = [r for r in range(WORLD) if r != RAISER]
DUMP_TIMEOUT_S = 20  # generous: every rank is alive when the raiser asks, so the wait ends once all wrote
JOB_BOUND_S = 90
EXIT_BOUND_S = 5.0  # from a healthy rank's last line to its process being gone
SCRIPT = "exit_exception.py"
MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB\n(simulated on CPU)"


def run(tmp_path: Path, raiser: int, mode: str, extra: dict[str, str] | None = None) -> Job:
    env = {**hang_env(tmp_path, DUMP_TIMEOUT_S), "INCIDENT_PG_TIMEOUT": "60", **(extra or {})}
    return run_ranks(SCRIPT, WORLD, str(STEPS), str(raiser), mode, timeout=JOB_BOUND_S, env=env)


def check_left_with_exception(tmp_path: Path, job: Job, how: str = "is leaving the job with an uncaught") -> None:
    """One incident, opened by the raiser on its way out, with every rank's part; the raiser's says why it
    left, and the analyzer says it first. ``how``: the raiser's log line, after "rank N "."""
    log = job.describe()
    assert not job.timed_out, log
    assert job.ranks[RAISER].returncode == 1, log
    dump_dir = tmp_path / "dumps"
    folder = only_incident(dump_dir, log)
    assert folder.name.endswith(f"-exception-r{RAISER}"), log
    dumps = load_incident(folder, list(range(WORLD)), log)
    frame = f"{WORKERS / SCRIPT}:{marker_line(SCRIPT, 'raise RuntimeError(')} in forward"
    note = dumps[RAISER]["exit"]
    assert (note["type"], note["message"], note["frame"]) == ("RuntimeError", MESSAGE, frame), note
    tb = note["traceback"].splitlines()
    assert tb[-1] == frame and tb[-2].endswith(" in train"), note["traceback"]
    for r, d in dumps.items():
        assert (d["dump_reason"], d["trigger_rank"]) == ("exception", RAISER), (r, d["dump_reason"], d["trigger_rank"])
        if r != RAISER:
            assert d["exit"] == {}, (r, d["exit"])
    first_line = MESSAGE.splitlines()[0]
    # The raiser's log says it, and that every rank wrote before it left.
    said = f"rank {RAISER} {how} RuntimeError: {first_line} ... at {frame}"
    assert said in job.ranks[RAISER].output, log
    lines = wrote_lines(job.ranks[RAISER].output)
    assert len(lines) == 1 and (lines[0].group(1), lines[0].group(2)) == (folder.name, str(WORLD)), log
    # The peers' own failure (the raiser's connections closed) follows from it: no second incident.
    for r in OTHERS:
        assert job.ranks[r].returncode != 0, log
        assert f"not dumping again: this rank wrote its part of incident {folder.name}" in job.ranks[r].output, log

    rc, report, raw = analyze(dump_dir)
    assert rc == 1, raw
    first = report["findings"][0]
    assert first["kind"] == "left_with_exception" and first["culprit_ranks"] == [RAISER], raw
    assert sorted(first["victim_ranks"]) == OTHERS, raw
    head = (f"rank {RAISER} (host {socket.gethostname()}, pid {dumps[RAISER]['pid']}) left the job with "
            f"RuntimeError: {first_line} ... at {frame}; ranks 0-1,3 waited for it in ")
    assert first["detail"].startswith(head), raw
    assert first["op"].endswith("all_reduce") and first["collective_seq_id"] == STEPS + 1, raw
    # The raiser, as the incident's trigger, says it in the log too, from the ranks' store summaries: the same
    # kind, rank, op, group and seq as the analyzer on the whole dumps.
    raiser_log = job.ranks[RAISER].output
    verdict = check_agreement(raiser_log, report, undecided_ok=False)
    assert verdict is not None and verdict.kind == "left_with_exception", raiser_log
    assert (f"left the job with RuntimeError: {first_line} ... at {frame}; ranks {','.join(map(str, OTHERS))} "
            "waited for it") in raiser_log, raiser_log


def check_healthy_exit(tmp_path: Path, job: Job, never_said: str) -> None:
    """Every rank exits 0 and is gone promptly after its last line, with no incident and without `never_said`
    in its log."""
    log = job.describe()
    assert not job.timed_out and all(r.returncode == 0 for r in job.ranks), log
    assert incident_dirs(tmp_path / "dumps") == [], log
    for r in job.ranks:
        lag = r.exit_lag_s()
        assert lag is not None and lag < EXIT_BOUND_S, f"rank {r.rank} took {lag}s to exit\n{log}"
        assert never_said not in r.output, log


def test_rank_leaving_with_exception_writes_its_part(tmp_path):
    job = run(tmp_path, RAISER, "plain")
    check_left_with_exception(tmp_path, job)
    # Python's own report still reaches stderr.
    out = job.ranks[RAISER].output
    assert "Traceback (most recent call last)" in out and f"RuntimeError: {MESSAGE.splitlines()[0]}" in out, out


def test_teardown_in_finally_still_says_why(tmp_path):
    """main tears the group down in a `finally:`, as torchtitan's does: the exception reaches sys.excepthook
    only once no group is left, so it is noted as the last group goes, and the incident is the same."""
    job = run(tmp_path, RAISER, "plain+finally")
    check_left_with_exception(tmp_path, job, how="tore down its groups while raising")


def test_teardown_while_handling_control_flow_adds_nothing(tmp_path):
    """A healthy job that tears its group down inside `except StopIteration:` (its data ran out): control flow,
    not a failure. No incident, exit 0, and each rank gone promptly."""
    check_healthy_exit(tmp_path, run(tmp_path, -1, "plain+in_except"), "tore down its groups")


def test_restart_after_a_caught_exception_leaves_no_note(tmp_path):
    """An in-process restart: rank 1's exception, caught, with the group torn down inside the `except:`. That
    teardown opens the incident that says why (the same as for an uncaught one); the next life's job-wide
    dump is an incident of its own (the lock the first one kept is let go), its parts carry no note, and both
    ranks finish."""
    job = run_ranks("restart_after_exception.py", 2, timeout=JOB_BOUND_S, env=hang_env(tmp_path, DUMP_TIMEOUT_S))
    log = job.describe()
    assert not job.timed_out and all(r.returncode == 0 for r in job.ranks), log
    results = job.results()
    assert [r["notes"]["caught"] for r in results] == ["DistBackendError", "RuntimeError"], log
    for r in results:
        assert r["failures"] == [] and r["notes"]["life1_reason"] == "manual", log
        assert r["notes"]["life1_exit"] == {}, log
    restarted = {r["notes"]["life1_folder"] for r in results}
    assert len(restarted) == 1 and "" not in restarted, log
    opened = [p for p in incident_dirs(tmp_path / "dumps") if p.name not in restarted]
    assert len(opened) == 1 and opened[0].name.endswith("-exception-r1"), log
    dumps = load_incident(opened[0], [0, 1], log)
    assert dumps[1]["exit"]["message"] == "simulated fault in forward" and dumps[0]["exit"] == {}, log
    assert "rank 1 tore down its groups while raising RuntimeError: simulated fault in forward" in job.ranks[1].output, log


def test_user_excepthook_set_before_init_runs(tmp_path):
    job = run(tmp_path, RAISER, "hook_before")
    check_left_with_exception(tmp_path, job)
    assert f"USER_HOOK RuntimeError: {MESSAGE.splitlines()[0]}" in job.ranks[RAISER].output, job.describe()


def test_user_excepthook_set_after_init_runs(tmp_path):
    """A hook set after frnccl's replaces it without chaining: the exit hook finds the exception all the same."""
    job = run(tmp_path, RAISER, "hook_after")
    check_left_with_exception(tmp_path, job)
    assert f"USER_HOOK RuntimeError: {MESSAGE.splitlines()[0]}" in job.ranks[RAISER].output, job.describe()


def test_elastic_record_still_writes_its_error_file(tmp_path):
    base = tmp_path / "error.json"
    job = run(tmp_path, RAISER, "record", {"ERROR_FILE_BASE": str(base)})
    check_left_with_exception(tmp_path, job)
    written = Path(f"{base}.{RAISER}")
    assert written.exists(), job.describe()
    message = json.loads(written.read_text())["message"]
    # What @record writes: the exception's message and its Python call stack.
    assert MESSAGE.splitlines()[0] in message["message"], message
    assert "in forward" in message["extraInfo"]["py_callstack"], message


def test_healthy_exit_adds_nothing(tmp_path):
    """No rank fails (each raises and catches one exception): no dump, and each rank is gone promptly."""
    check_healthy_exit(tmp_path, run(tmp_path, -1, "plain"), "leaving the job with")


@pytest.mark.parametrize("mode", ["report", "report+finally"])
def test_explicit_excepthook_call_on_a_healthy_run_adds_nothing(mode, tmp_path):
    """A library that reports a handled exception through sys.excepthook on a healthy job (report+finally: then
    a teardown in a `finally:` with nothing in flight): the run exits 0 with no error file for torchrun, no
    dump, and each rank gone promptly: only the exception that ended the program is a reason to leave."""
    base = tmp_path / "error"
    job = run(tmp_path, -1, mode, {"ERROR_FILE_BASE": str(base)})
    check_healthy_exit(tmp_path, job, "tore down its groups")
    log = job.describe()
    assert all("ValueError: handled by the script" in r.output for r in job.ranks), log  # the hook did run
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("error")) == [], log


def test_note_is_bounded_and_escaped():
    """What the native side keeps of hostile text: control characters escaped, each field cut to its bound at
    a character boundary, line breaks kept only where they are structure."""
    code = ("from fr_backend._native import native; n = native(); "
            "n.note_exit('Bad\\x1b[31mType', 'line1\\nline2\\x07' + '\\u00e9' * 2000, 'f.py:1 in g\\r\\n', 'a\\nb\\x00'); "
            "print(repr(n.exit_note()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kind, message, frame, tb = ast.literal_eval(out.stdout.strip())
    assert kind == "Bad\\x1b[31mType", kind
    assert message.startswith("line1\nline2\\x07\u00e9") and message.endswith("\u00e9...") , message[:40]
    assert len(message.encode()) <= 1000 + 3, len(message.encode())
    assert frame == "f.py:1 in g\\x0d\\x0a", frame
    assert tb == "a\nb\\x00", tb


def test_analyzer_reads_only_what_an_exit_note_can_be():
    """A dump without the key (older ones) or with a malformed one has no note; text is escaped for display."""
    from fr_backend.analyzer.header import exit_info

    assert exit_info(None) is None and exit_info({}) is None and exit_info({"type": 3}) is None
    got = exit_info({"type": "E\nrr", "message": "m\x1b[2J\nsecond", "frame": ["x"], "traceback": "t"})
    assert got is not None
    assert (got.type, got.message, got.frame, got.traceback) == ("E\\x0arr", "m\\x1b[2J\nsecond", "", "t")
    assert got.one_line() == "E\\x0arr: m\\x1b[2J ..."


def _note_and_file(tmp_path: Path, raise_code: str) -> tuple[object, dict | None, int]:
    """In a fresh process: the exception `raise_code` raises reaches the top; returns (the native note, the
    error file for torchrun after the exit hook's Python side ran, or None if none, the whole second in which
    the exception was caught)."""
    err = tmp_path / "error.json"
    code = ("import sys, time, torch.distributed as dist, torch.distributed.elastic.multiprocessing.api as api\n"
            "from fr_backend import _exit_note\nfrom fr_backend._native import native\n_exit_note.install()\n"
            f"try:\n    {raise_code}\nexcept BaseException as e:\n    exc = e\n"
            "print('T0', int(time.time()))\n_exit_note.record(exc)\n_exit_note.after_exit()\nprint(repr(native().exit_note()))\n")
    env = {**__import__("os").environ, "TORCHELASTIC_ERROR_FILE": str(err)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    caught = int(next(ln.split()[1] for ln in lines if ln.startswith("T0 ")))
    data = json.loads(err.read_text()) if err.exists() else None
    err.unlink(missing_ok=True)
    return ast.literal_eval(lines[-1]), data, caught


def test_victim_error_file_never_wins_the_timestamp_tie(tmp_path):
    """torchrun's root cause is the smallest whole-second timestamp: a rank that leaves because a collective
    failed gets a later one than any raiser of the same second, and notes nothing natively."""
    note, data, caught = _note_and_file(tmp_path, "raise dist.DistBackendError('gloo: timed out')")
    assert note is None, note
    assert data is not None and int(data["message"]["extraInfo"]["timestamp"]) >= caught + 1, (caught, data)
    # a rank's own exception keeps its own time: it is the root cause of its second
    note, data, caught = _note_and_file(tmp_path, "raise RuntimeError('own fault')")
    assert note is not None and note[0] == "RuntimeError", note
    assert data is not None and int(data["message"]["extraInfo"]["timestamp"]) <= caught, (caught, data)


def test_stop_and_monitored_barrier_are_not_this_ranks_fault(tmp_path):
    """torch elastic's SignalException (the launcher stopping this rank) and Gloo monitored_barrier's report of
    another rank are never noted; a RuntimeError that merely quotes that text is."""
    import signal

    for raise_code in ("raise api.SignalException('Process 1 got signal: 15', sigval=signal.SIGTERM)",
                       "raise RuntimeError('[/pytorch/torch/csrc/distributed/c10d/ProcessGroupGloo.cpp:2985] "
                       "Rank 3 failed to pass monitoredBarrier in 1000 ms')",
                       "raise RuntimeError('Rank 1 failed to pass monitoredBarrier in 30000 ms\\n Original exception: x')"):
        note, data, _ = _note_and_file(tmp_path, "import signal; " + raise_code)
        assert note is None and data is None, (raise_code, note, data)
    note, _, _ = _note_and_file(tmp_path, "raise RuntimeError('my check: Rank 1 failed to pass monitoredBarrier in 5 ms')")
    assert note is not None, note
