"""torchrun's failure summary ("Root Cause (first observed failure)") says why the job failed, from the error
file (TORCHELASTIC_ERROR_FILE) a rank that leaves with an uncaught exception writes, with or without @record.

Real torchrun jobs (--standalone, 4 workers on CPU) with a hard time bound; the assertions read torchrun's own
output.
"""

from __future__ import annotations

import re
import sys

import pytest

from dist_harness import WORKERS, Job, run_commands
from test_incidents import _torchrun_env, analyze, hang_env, load_incident, marker_line, only_incident

WORLD = 4
PG_TIMEOUT_S = 4
DUMP_TIMEOUT_S = 20
JOB_BOUND_S = 120
FRNCCL_LINE = re.compile(r"frnccl: rank (\d+) \(host [^,]+, pid (\d+)\) left the job with (.*)")


def torchrun(script: str, *args: str, env: dict[str, str]) -> Job:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--standalone",
           "--max-restarts", "0", "--monitor-interval", "0.2", str(WORKERS / script), *args]
    return run_commands([cmd], [_torchrun_env(env)], JOB_BOUND_S)


def root_cause(job: Job) -> str:
    """The "Root Cause (first observed failure)" section torchrun printed."""
    out = job.ranks[0].output
    m = re.search(r"Root Cause \(first observed failure\):\n(.*?)\n=+", out, re.S)
    assert m, f"torchrun printed no failure summary\n{job.describe()}"
    return m.group(1)


def summary_text(job: Job) -> str:
    """torchrun's whole failure summary: the other failures and the root cause."""
    out = job.ranks[0].output
    start = out.find("ChildFailedError")
    assert start >= 0, f"torchrun printed no failure summary\n{job.describe()}"
    return out[start:]


def field(section: str, name: str) -> str:
    m = re.search(rf"^\s*{name}\s*: (.*)$", section, re.M)
    assert m, f"no {name} in\n{section}"
    return m.group(1)


def check_exception_summary(tmp_path, job: Job, with_record: bool) -> None:
    log = job.describe()
    assert not job.timed_out and job.ranks[0].returncode != 0, log
    cause = root_cause(job)
    assert field(cause, "rank").startswith("2 "), f"the rank that raised is the root cause\n{log}"
    frame = f"{WORKERS / 'exit_exception.py'}:{marker_line('exit_exception.py', 'raise RuntimeError(')} in forward"
    m = FRNCCL_LINE.search(cause)
    assert m and m.group(1) == "2", f"no frnccl line in the root cause\n{log}"
    assert m.group(3) == f"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB ... at {frame}", log
    folder = only_incident(tmp_path / "dumps", log)
    assert f"frnccl: its dump and the other ranks' are in {folder}: frnccl analyze {folder}" in cause, log
    # The job's verdict comes first: what torchrun's summary shows on top.
    top = field(cause, "traceback")
    assert top.startswith("frnccl: verdict: left_with_exception: rank 2 ("), log
    # The traceback is still there under frnccl's lines: @record's own, or Python's.
    assert "Traceback (most recent call last)" in cause and "in forward" in cause, log
    assert field(cause, "error_file") != "<N/A>", log
    if with_record:
        # What @record wrote is kept: its message, as torchrun shows in the failure's line.
        assert "RuntimeError: CUDA out of memory" in cause, log


def test_rank_that_raises(tmp_path):
    job = torchrun("exit_exception.py", "6", "2", "plain", env={**hang_env(tmp_path, DUMP_TIMEOUT_S),
                                                                "INCIDENT_PG_TIMEOUT": "60"})
    check_exception_summary(tmp_path, job, with_record=False)


def test_rank_that_raises_under_record(tmp_path):
    job = torchrun("exit_exception.py", "6", "2", "record", env={**hang_env(tmp_path, DUMP_TIMEOUT_S),
                                                                 "INCIDENT_PG_TIMEOUT": "60"})
    check_exception_summary(tmp_path, job, with_record=True)


def test_rank_that_raises_and_tears_down_in_finally(tmp_path):
    """torchtitan's main: destroy_process_group in a `finally:` while the exception propagates, so no group is
    left once it reaches sys.excepthook. The summary says the same as without the teardown."""
    job = torchrun("exit_exception.py", "6", "2", "plain+finally", env={**hang_env(tmp_path, DUMP_TIMEOUT_S),
                                                                        "INCIDENT_PG_TIMEOUT": "60"})
    check_exception_summary(tmp_path, job, with_record=False)


@pytest.mark.parametrize("victims", ["raise", "catch"])
def test_rank_never_joins(tmp_path, victims):
    """The victims time out and leave: with frnccl's DistBackendError uncaught, or having caught it and called
    sys.exit(1) (no @record), as most loops do. Either way the root cause is the culprit, which torchrun
    stopped: its error file, written on SIGTERM, carries the second it took part in the incident, before any
    victim's. The summary says the verdict, with the incident that holds every rank's dump."""
    culprit = 1
    env = {**hang_env(tmp_path, DUMP_TIMEOUT_S), "INCIDENT_PG_TIMEOUT": str(PG_TIMEOUT_S)}
    if victims == "catch":
        env["INCIDENT_VICTIM_EXIT"] = "catch"
    job = torchrun("incident_hang.py", "sleep", "3", str(culprit), env=env)
    log = job.describe()
    assert not job.timed_out and job.ranks[0].returncode != 0, log
    cause = root_cause(job)
    failures = summary_text(job)
    assert field(cause, "rank").startswith(f"{culprit} ") and "SIGTERM" in field(cause, "exitcode"), log
    assert field(cause, "traceback").startswith(f"frnccl: verdict: not_joined: rank {culprit} ("), log
    assert f"was stopped by SIGTERM after incident " in cause and ", whose verdict names it" in cause, log
    if victims == "raise":
        m = FRNCCL_LINE.search(failures)
        assert m and int(m.group(1)) != culprit, f"no victim's frnccl line in torchrun's summary\n{log}"
        assert m.group(3).startswith("torch.distributed.DistBackendError: frnccl: gloo:all_reduce on process group '0' (default_pg), "
                                     "collective_seq_id 4, timed out after"), log
    else:
        left = re.findall(r"frnccl: rank (\d+) \(host [^,]+, pid \d+\) left the job after incident ", failures)
        assert left and culprit not in {int(r) for r in left}, f"no victim's frnccl line in torchrun's summary\n{log}"
    folder = only_incident(tmp_path / "dumps", log)
    assert f"frnccl: its dump and the other ranks' are in {folder}" in failures, log
    assert f"traceback : frnccl: verdict: not_joined: rank {culprit} (" in failures, log
    # The victims' own exceptions follow from the timeout: no dump blames them for leaving.
    dumps = load_incident(folder, list(range(WORLD)), log)
    for r, d in dumps.items():
        assert (d["dump_reason"], d["exit"]) == ("timeout", {}), (r, d["dump_reason"], d["exit"])
    rc, report, raw = analyze(tmp_path / "dumps")
    first = report["findings"][0]
    assert first["kind"] == "not_joined" and first["culprit_ranks"] == [culprit], raw


@pytest.mark.parametrize("stop", ["", "term-at-exit"], ids=["plain", "term-at-exit"])
def test_rank_that_skipped_a_step_and_left(tmp_path, stop):
    """DDP, FRNCCL_ENABLE=1: rank 1 skips one step's gradient all_reduce, finishes its loop one op short and
    exits 0; the others fail in the last all_reduce. torchrun can only name a rank that failed, so its root
    cause is a victim; its words must still be the verdict naming rank 1, whoever the victim is and however
    quickly it left (its error was raised before the verdict came: the rank's exit waits for it, bounded).
    term-at-exit: torchrun's SIGTERM reaches each victim as its exit writes the error file (in CI a victim so
    stopped showed only "Signal 15 (SIGTERM) received": frnccl's threads, and its SIGTERM dump, were stopped
    before the file was written)."""
    skipper = 1
    job = torchrun("ddp_skip_step.py", str(skipper), "5", *([stop] if stop else []),
                   env={**hang_env(tmp_path, 20), "FRNCCL_ENABLE": "1"})
    log = job.describe()
    assert not job.timed_out and job.ranks[0].returncode != 0, log
    verdicts = sorted({ln for ln in job.ranks[0].output.splitlines() if ln.startswith("frnccl: verdict: ")})
    assert len(verdicts) == 1 and verdicts[0].startswith(f"frnccl: verdict: missing_dump: rank {skipper} ("), log
    cause = root_cause(job)
    if stop and field(cause, "rank").startswith(f"{skipper} "):
        # The victims ended at once, before rank 1's interpreter had: torchrun stopped it too, and, with no error
        # file from a rank that left before the incident, dates its failure when it saw it, before theirs.
        assert field(cause, "traceback").startswith("Signal 15 (SIGTERM)"), log
    else:
        assert not field(cause, "rank").startswith(f"{skipper} "), log  # it exited 0: not a failure to torchrun
        assert field(cause, "traceback") == verdicts[0], log
    # The victims' sections. Rank 1 may have one too: torchrun stops it with the others if it is still ending
    # its process (it left before the incident, so it has nothing to say and torchrun reports the signal).
    sections = [s for s in summary_text(job).split("\n[")[1:]
                if "traceback :" in s and not field(s, "rank").startswith(f"{skipper} ")]
    assert sections, log
    for section in sections:
        assert field(section, "traceback") == verdicts[0], section
    if stop:
        for section in sections:
            assert "SIGTERM" in field(section, "exitcode") and "was stopped by SIGTERM after incident " in section, section
    rc, report, raw = analyze(tmp_path / "dumps")
    first = report["findings"][0]
    assert first["culprit_ranks"] == [skipper], raw


def test_size_mismatch(tmp_path):
    """gloo aborts the culprit (SIGABRT) as its ring hands it too much data (or, on another gloo, raises)."""
    culprit = 2
    job = torchrun("incident_mismatch.py", "size", "3", str(culprit),
                   env={**hang_env(tmp_path, 5), "INCIDENT_PG_TIMEOUT": str(PG_TIMEOUT_S)})
    log = job.describe()
    assert not job.timed_out and job.ranks[0].returncode != 0, log
    cause = root_cause(job)
    folder = only_incident(tmp_path / "dumps", log)
    if "SIGABRT" in field(cause, "exitcode"):
        # The aborting rank's error file, written by frnccl's SIGABRT handler, says which rank and where.
        m = re.search(r"frnccl: rank (\d+) \(host [^,]+, pid (\d+)\) aborted \(SIGABRT", cause)
        assert m and int(m.group(1)) == culprit and field(cause, "rank").startswith(f"{culprit} "), log
        assert field(cause, "error_file") != "<N/A>", log
    else:  # gloo raised instead: the rank that left with its error says so
        assert FRNCCL_LINE.search(cause), log
    assert f"frnccl: its dump and the other ranks' are in {folder}" in cause, log


def test_sigkilled_rank(tmp_path):
    """No process can write a killed rank's file: torchrun names it by its signal, and frnccl's files from the
    survivors never take the root cause from it."""
    killed = 1
    job = torchrun("incident_kill.py", "3", str(killed), env=hang_env(tmp_path, 5))
    log = job.describe()
    assert not job.timed_out and job.ranks[0].returncode != 0, log
    cause = root_cause(job)
    assert field(cause, "rank").startswith(f"{killed} ") and "SIGKILL" in cause, log


@pytest.mark.timeout(JOB_BOUND_S + 30)
def test_rank_that_raises_outside_collectives(tmp_path):
    """A quorum's timeout outside any collective: torchrun's root cause is the raiser, and the verdict on top of it
    says what it raised and where the others were, word for word as the log's and `frnccl analyze`'s."""
    raiser = 1
    job = torchrun("outside_collectives.py", str(raiser), env=hang_env(tmp_path, DUMP_TIMEOUT_S))
    log = job.describe()
    assert not job.timed_out and job.ranks[0].returncode != 0, log
    cause = root_cause(job)
    assert field(cause, "rank").startswith(f"{raiser} "), log
    top = field(cause, "traceback")
    assert top.startswith(f"frnccl: verdict: undecided: rank {raiser} (") and " raised outside collectives: " in top, log
    assert top in log.splitlines(), log  # the log's verdict line itself
    rc, report, raw = analyze(tmp_path / "dumps")
    first = report["findings"][0]
    assert rc == 1 and first["kind"] == "outside_collectives" and first["culprit_ranks"] == [], raw
    assert top == f"frnccl: verdict: undecided: {first['detail']}", raw
