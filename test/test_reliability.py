"""Reliability under faults and bad input: real CPU (Gloo) jobs whose ranks are killed, terminated, lose their
store host, cannot write their dumps, get many dump requests at once, or issue collectives from many threads;
plus every FRNCCL_* setting given a bad value. docs/reliability.md maps each test to the promise it checks.

Every job is a set of real processes (dist_harness: one session per rank, a real TCPStore hosted by rank 0,
or torchrun where the launcher is the point) with a hard time bound; pytest-timeout bounds each test too.
Workers: workers/reliability.py (and scripts/soak.py for the soak).
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fr_backend
from dist_harness import TEST_DIR, WORKERS, Job, JobThread, _env, free_port, run_commands, run_ranks, wait_for
from fr_backend import config as frconfig
from test_incidents import WROTE_RE, analyze

ROOT = TEST_DIR.parent
PG_TIMEOUT_S = 10  # group timeout of the fault jobs (their ops never get near it)
DUMP_TIMEOUT_S = 4  # FRNCCL_DUMP_TIMEOUT_SEC: how long a trigger waits for a rank that is gone
# The promise for a job that loses a rank or its store host: every survivor is gone within the group timeout
# + the dump timeout + 30 s. dist_harness stops survivors 15 s after a rank died, so the tests also check
# that a survivor exited by itself (its own exit code, not the harness's SIGKILL).
BOUND_S = PG_TIMEOUT_S + DUMP_TIMEOUT_S + 30
BIG_ENTRIES = 10000  # deep-stack entries that make a rank's dump take seconds (~50 MB of pickle + JSON)
NOT_WRITTEN_RE = re.compile(r"\[frnccl rank (\d+)\] dump (\S+) NOT written: cannot (?:create|write) (\S+): (.+)$", re.M)


# ----------------------------------------------------------------------------- helpers


def fault_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        "FRNCCL_DUMP_DIR": str(tmp_path / "dumps"),
        # Not the default (compact): these faults are about how files are written (temporaries, a full disk,
        # a rank killed mid-write), and pickle + JSON give two files per rank, big enough to take seconds.
        "FRNCCL_DUMP_FORMATS": "pickle,json",
        "FRNCCL_DUMP_TIMEOUT_SEC": str(DUMP_TIMEOUT_S),
        "FRNCCL_COORD_CHECK_MS": "100",
        "RELIABILITY_PG_TIMEOUT": str(PG_TIMEOUT_S),
    }
    env.update(extra)
    return env


class Ranks(JobThread):
    """`workers/reliability.py` as WORLD plain ranks (dist_harness.run_ranks) in a thread, so the test can act on
    the running job. `state` is the folder the ranks and the test share."""

    def __init__(self, tmp_path: Path, world: int, *args: str, env: dict[str, str], timeout: float = 150) -> None:
        self.state = tmp_path / "state"
        self.state.mkdir()
        self.world = world
        mode, rest = args[0], args[1:]
        super().__init__(lambda: run_ranks("reliability.py", world, mode, str(self.state), *rest, timeout=timeout, env=env))

    def wait_running(self, timeout: float = 120) -> None:
        wait_for(lambda: (self.state / "running").exists() and all(self.pid_file(r).exists() for r in range(self.world)),
                 timeout, "the ranks to run their loop", self)

    def pid_file(self, rank: int) -> Path:
        return self.state / f"pid_{rank}"

    def pid(self, rank: int) -> int:
        return int(self.pid_file(rank).read_text())

    def stop(self) -> None:
        (self.state / "stop").write_text("1")


FINAL_NAME = re.compile(r"frnccl_rank_\d+(\.json|\.json\.gz|\.trace\.json)?|verdict\.json")  # verdict: judging rank's


def partial_files(dump_dir: Path) -> list[Path]:
    """Files in the dump folder that are not whole dumps under their final names (a temporary file left behind)."""
    if not dump_dir.exists():
        return []
    return sorted(p for p in dump_dir.rglob("*") if p.is_file() and not FINAL_NAME.fullmatch(p.name))


def final_files(dump_dir: Path) -> list[Path]:
    return sorted(p for p in dump_dir.rglob("frnccl_rank_*") if p.is_file()) if dump_dir.exists() else []


def check_final_files_whole(dump_dir: Path, log: str) -> dict[Path, dict[str, Any]]:
    """Every file under its final name must be a whole dump: it loads, and says which rank wrote it."""
    loaded = {}
    for path in final_files(dump_dir):
        try:
            d = fr_backend.load_dump(str(path))
        except Exception as err:  # noqa: BLE001
            pytest.fail(f"{path} is under its final name but does not load: {err}\n{log}", pytrace=False)
        assert path.name.startswith(f"frnccl_rank_{d['rank']}"), (path, d["rank"])
        assert d["incident_id"] == path.parent.parent.name, (path, d["incident_id"])
        loaded[path] = d
    return loaded


def rank_files(folder: Path) -> dict[str, list[str]]:
    """format folder -> sorted file names (dot files included)."""
    return {fmt.name: sorted(p.name for p in fmt.iterdir()) for fmt in sorted(folder.iterdir()) if fmt.is_dir()}


def incident_folders(dump_dir: Path) -> list[Path]:
    return sorted(p for p in dump_dir.iterdir() if p.is_dir()) if dump_dir.exists() else []


def gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def exited_by_itself(job: Job, rank: int) -> bool:
    """The rank ended on its own: dist_harness only ever stops ranks with SIGKILL."""
    return job.ranks[rank].returncode not in (None, -signal.SIGKILL)


def seconds_after(job: Job, rank: int, t0: float) -> float:
    exited = job.ranks[rank].exited_mono
    assert exited is not None, f"rank {rank} was never seen exiting"
    return exited - t0


def file_being_written(dump_dir: Path, pid: int) -> Path | None:
    """The dump file `pid` has open for writing, if any: an unnamed O_TMPFILE file shows in /proc as
    `<incident>/<format>/#<inode> (deleted)`, a named temporary file under its own name. The folders the writer
    holds open on the way down (it opens each one O_NOFOLLOW) are not it."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return None
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            is_file = stat.S_ISREG(os.stat(f"/proc/{pid}/fd/{fd}").st_mode)
        except OSError:  # closed while we looked
            continue
        if is_file and target.startswith(str(dump_dir) + "/"):
            return Path(target)
    return None


def wait_partial(dump_dir: Path, pid: int, bg: Any, timeout: float = 60) -> Path:
    """Polls (every 2 ms) until process `pid` has a dump file open for writing."""
    found: list[Path] = []

    def seen() -> bool:
        path = file_being_written(dump_dir, pid)
        if path is not None:
            found.append(path)
        return bool(found)

    wait_for(seen, timeout, f"pid {pid} to be writing its dump", bg, poll_s=0.002)
    return found[0]


def _all_threads_stopped(pid: int) -> bool:
    try:
        states = [Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0]
                  for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return False
    return bool(states) and all(st in "Tt" for st in states)


def signal_mid_write(dump_dir: Path, rank: int, pid: int, sig: int, bg: Any, timeout: float = 60) -> Path:
    """Delivers `sig` to rank `rank` while it is writing a dump file, for certain: once it has one open, the rank
    is frozen (SIGSTOP); if the file is still open, `sig` is sent and the rank resumed (SIGCONT), so `sig` acts
    before the write can go on. Returns the file it was writing (as /proc names it)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        partial = wait_partial(dump_dir, pid, bg, timeout=max(1.0, end - time.monotonic()))
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: _all_threads_stopped(pid), 10, f"rank {rank} to stop")
            if file_being_written(dump_dir, pid) is not None:
                os.kill(pid, sig)
                return partial
        finally:
            os.kill(pid, signal.SIGCONT)
    pytest.fail(f"never caught rank {rank} in the middle of writing a dump file", pytrace=False)


# ----------------------------------------------------------------------------- 1. SIGKILL inside a collective


def test_sigkill_inside_collective(tmp_path):
    """test_incidents.test_rank_killed kills a rank between two collectives; here a rank is killed from outside
    while every rank is inside 8 MB all_reduces back to back, so it dies with ops in flight."""
    killed, others = 1, [0, 2]
    dump_dir = tmp_path / "dumps"
    bg = Ranks(tmp_path, 3, "loop", env=fault_env(tmp_path, RELIABILITY_PAYLOAD=str(2_000_000), RELIABILITY_PAUSE_S="0"))
    try:
        bg.wait_running()
        time.sleep(1.0)  # a few rounds: every rank is in the payload all_reduce most of the time
        os.kill(bg.pid(killed), signal.SIGKILL)
        t_kill = time.monotonic()
    finally:
        bg.stop()
    job = bg.finish()
    log = job.describe()
    assert not job.timed_out, log
    assert job.ranks[killed].returncode == -signal.SIGKILL, log
    for r in others:
        assert exited_by_itself(job, r) and job.ranks[r].returncode == 3, f"rank {r} must fail by itself\n{log}"
        assert f"OUTCOME {r} raised" in job.ranks[r].output, log
        assert seconds_after(job, r, t_kill) <= BOUND_S, log

    folders = incident_folders(dump_dir)
    assert len(folders) == 1, f"want one incident, got {[f.name for f in folders]}\n{log}"
    folder = folders[0]
    assert rank_files(folder) == {"json": [f"frnccl_rank_{r}.json" for r in others],
                                  "pickle": [f"frnccl_rank_{r}" for r in others]}, (rank_files(folder), log)
    dumps = {d["rank"]: d for d in check_final_files_whole(dump_dir, log).values()}
    for r in others:
        d = dumps[r]
        assert d["dump_reason"] == "error", (r, d["dump_reason"], d["dump_detail"])
        last = d["entries"][-1]
        assert last["profiling_name"].endswith("all_reduce") and last["state"] != "completed", (r, last)
    m = [m for m in WROTE_RE.finditer(log) if m.group(1) == folder.name]
    assert len(m) == 1 and (m[0].group(2), m[0].group(3), m[0].group(5)) == ("2", "3", str(killed)), log

    rc, report, raw = analyze(dump_dir)
    assert rc == 1 and report["ranks_missing"] == [killed], raw
    first = report["findings"][0]
    assert first["kind"] == "missing_dump" and first["culprit_ranks"] == [killed], raw


# ----------------------------------------------------------------------------- 2. SIGTERM while a dump is written


@pytest.fixture(scope="module")
def sigterm_job(tmp_path_factory) -> dict[str, Any]:
    """2 plain ranks; rank 1 holds BIG_ENTRIES deep-stack entries, so writing its dump takes a while. A job-wide
    dump (SIGUSR1 to rank 0), and SIGTERM to rank 1 while it is writing a dump file (signal_mid_write).
    FRNCCL_DUMP_ON_TERMINATE_MS=0: the signal cuts the write short, as it does once that bound has passed (by
    default the rank lets its dump finish for up to 1 s: test_terminate_dump.py)."""
    tmp_path = tmp_path_factory.mktemp("sigterm")
    dump_dir = tmp_path / "dumps"
    bg = Ranks(tmp_path, 2, "loop", str(BIG_ENTRIES), "1", env=fault_env(tmp_path, FRNCCL_DUMP_ON_TERMINATE_MS="0"))
    try:
        bg.wait_running()
        os.kill(bg.pid(0), signal.SIGUSR1)
        partial = signal_mid_write(dump_dir, 1, bg.pid(1), signal.SIGTERM, bg)
        t_term = time.monotonic()
    finally:
        bg.stop()
    job = bg.finish()
    return {"job": job, "t_term": t_term, "partial": partial, "dump_dir": dump_dir, "log": job.describe()}


def test_sigterm_while_writing_dump(sigterm_job):
    """The terminated rank goes at once; its survivor notices, reports the missing rank and exits by itself; no
    file under a final name is torn."""
    job, log, dump_dir = sigterm_job["job"], sigterm_job["log"], sigterm_job["dump_dir"]
    assert not job.timed_out, log
    assert job.ranks[1].returncode == -signal.SIGTERM, log
    assert seconds_after(job, 1, sigterm_job["t_term"]) < 5, f"SIGTERM must end the rank at once\n{log}"
    assert exited_by_itself(job, 0) and job.ranks[0].returncode == 3, log
    assert seconds_after(job, 0, sigterm_job["t_term"]) <= BOUND_S, log

    incident = sigterm_job["partial"].parent.parent
    files = check_final_files_whole(dump_dir, log)
    # Rank 0 wrote its part of the signalled incident; rank 1 never finished it.
    assert {p.relative_to(incident).as_posix() for p in files if p.parent.parent == incident} == {
        "pickle/frnccl_rank_0", "json/frnccl_rank_0.json"}, (files, log)
    m = [m for m in WROTE_RE.finditer(log) if m.group(1) == incident.name]
    assert len(m) == 1 and (m[0].group(2), m[0].group(3), m[0].group(5)) == ("1", "2", "1"), log


def test_sigterm_while_writing_dump_leaves_no_temp_file(sigterm_job):
    leftovers = partial_files(sigterm_job["dump_dir"])
    assert not leftovers, f"temporary files left in the dump folder: {leftovers}"


def _torchrun_cmd(nproc: int, rdzv_port: int, *args: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv_port}", "--max-restarts", "0",
        "--monitor-interval", "0.2", str(WORKERS / "reliability.py"), *args,
    ]


def _torchrun_env(extra: dict[str, str]) -> dict[str, str]:
    env = _env(0, 1, 0, extra)
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(key)  # torchrun sets them per rank
    return env


class Torchrun(Ranks):
    """`workers/reliability.py` under torchrun (2 ranks) in a thread; the Job has one 'rank': torchrun itself."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str], timeout: float = 150) -> None:
        self.state = tmp_path / "state"
        self.state.mkdir()
        self.world = 2
        self.job = None
        self.error = None
        cmd = _torchrun_cmd(self.world, free_port(), args[0], str(self.state), *args[1:])
        JobThread.__init__(self, lambda: run_commands([cmd], [_torchrun_env(env)], timeout))

    def launcher_pid(self) -> int:
        return int((self.state / "ppid_0").read_text())


def test_launcher_sigterm_during_dump(tmp_path):
    """torchrun is told to stop (SIGTERM, as a scheduler would) while rank 1 writes a large dump: torchrun passes
    SIGTERM on to its workers; every process is gone promptly and no file under a final name is torn."""
    dump_dir = tmp_path / "dumps"
    bg = Torchrun(tmp_path, "loop", str(BIG_ENTRIES), "1", env=fault_env(tmp_path))
    try:
        bg.wait_running()
        launcher, workers = bg.launcher_pid(), [bg.pid(0), bg.pid(1)]
        assert int((bg.state / "ppid_1").read_text()) == launcher
        os.kill(workers[0], signal.SIGUSR1)
        wait_partial(dump_dir, bg.pid(1), bg)
        os.kill(launcher, signal.SIGTERM)
        t_term = time.monotonic()
        wait_for(lambda: all(gone(p) for p in workers), 40, "torchrun's workers to be gone")
        workers_gone_s = time.monotonic() - t_term
    finally:
        bg.stop()
    job = bg.finish()
    log = job.describe()
    assert not job.timed_out, log
    assert job.ranks[0].returncode not in (0, None, -signal.SIGKILL), f"torchrun must fail by itself\n{log}"
    assert "closing signal SIGTERM" in job.ranks[0].output, log  # torchrun's own line: it stopped them with SIGTERM
    # torchrun gives its workers 30 s after SIGTERM before SIGKILL: they must not need it.
    assert workers_gone_s < 10, f"workers took {workers_gone_s:.1f}s to go after SIGTERM\n{log}"
    assert seconds_after(job, 0, t_term) < 20, log
    files = check_final_files_whole(dump_dir, log)
    assert any(p.name == "frnccl_rank_0" for p in files), f"rank 0 wrote its part before the stop\n{log}"


# ----------------------------------------------------------------------------- 3. the store host (rank 0) dies


def local_folders(dump_dir: Path, rank: int) -> list[Path]:
    return [f for f in incident_folders(dump_dir) if f.name.endswith("-local") and (f / "pickle" / f"frnccl_rank_{rank}").exists()]


def check_survivors(job: Job, t_kill: float, survivors: list[int], log: str) -> None:
    assert not job.timed_out, log
    assert job.ranks[0].returncode == -signal.SIGKILL, log
    for r in survivors:
        assert exited_by_itself(job, r), f"rank {r} had to be stopped by the harness\n{log}"
        assert f"OUTCOME {r} raised" in job.ranks[r].output and job.ranks[r].returncode == 3, log
        took = seconds_after(job, r, t_kill)
        assert took <= BOUND_S, f"rank {r} took {took:.1f}s to exit after the store host died\n{log}"


@pytest.fixture(scope="module")
def store_killed_job(tmp_path_factory) -> dict[str, Any]:
    """3 plain ranks loop over collectives; rank 0, which hosts the TCPStore, is SIGKILLed."""
    tmp_path = tmp_path_factory.mktemp("store_killed")
    bg = Ranks(tmp_path, 3, "loop", env=fault_env(tmp_path))
    try:
        bg.wait_running()
        time.sleep(0.5)
        os.kill(bg.pid(0), signal.SIGKILL)
        t_kill = time.monotonic()
    finally:
        bg.stop()
    job = bg.finish()
    return {"job": job, "t_kill": t_kill, "dump_dir": tmp_path / "dumps", "log": job.describe()}


def test_store_host_killed_before_dump(store_killed_job):
    """The survivors' ops fail, the job-wide dump cannot reach the store, and each survivor dumps on its own
    (`<incident>-local`) and exits by itself."""
    survivors = [1, 2]
    job, log, dump_dir = store_killed_job["job"], store_killed_job["log"], store_killed_job["dump_dir"]
    check_survivors(job, store_killed_job["t_kill"], survivors, log)
    files = check_final_files_whole(dump_dir, log)
    for r in survivors:
        assert f"[frnccl rank {r}] store unreachable (" in job.ranks[r].output, f"rank {r}\n{log}"
        mine = local_folders(dump_dir, r)
        assert len(mine) == 1, f"rank {r}: local incidents {mine}\n{log}"
        assert f"[frnccl rank {r}] wrote dump {mine[0].name} " in job.ranks[r].output, log
        assert rank_files(mine[0]) == {"json": [f"frnccl_rank_{r}.json"], "pickle": [f"frnccl_rank_{r}"]}, log
        d = files[mine[0] / "pickle" / f"frnccl_rank_{r}"]
        assert d["dump_reason"] == "error" and d["trigger_rank"] == r, (d["dump_reason"], d["trigger_rank"])
    assert len(incident_folders(dump_dir)) == len(survivors), f"one local incident per survivor\n{log}"
    assert not partial_files(dump_dir), log


def test_store_failure_log_is_one_line(store_killed_job):
    """What a survivor logs when the store is gone is one line that says what frnccl does about it, and no more:
    no torch warning with its C++ backtrace, which torch's client printed for the wake wait frnccl keeps pending
    (15 lines per survivor, for a fault that is not frnccl's to report)."""
    job = store_killed_job["job"]
    for r in (1, 2):
        out = job.ranks[r].output
        assert "Exception raised from" not in out and "frame #" not in out, f"rank {r}\n{store_killed_job['log']}"
        lines = [ln for ln in job.ranks[r].output.splitlines() if ln.startswith(f"[frnccl rank {r}] store unreachable")]
        assert lines, store_killed_job["log"]
        # Each line is whole (no backtrace cut short) and says what frnccl does about it: the monitor's poll may
        # notice first ("requests will not reach this rank"), the failed op's incident then dumps locally.
        tails = "dumping this rank only|job-wide dump requests will not reach this rank"
        assert all(re.fullmatch(rf"\[frnccl rank {r}\] store unreachable \([^\n]+\); ({tails})", ln)
                   for ln in lines), lines
        assert any(ln.endswith("dumping this rank only") for ln in lines), lines


def test_store_host_that_left_is_not_polled_again(tmp_path):
    """Rank 0, which hosts the TCPStore, ends first (a rank that finished its work); rank 1 runs on. Its wake
    wait's connection closes and frnccl prints one line; after that, frnccl stops using the store, however long
    the rank runs, and its later dumps are written locally. No torch warning with a C++ backtrace is printed: not
    for the pending wait (frnccl's own client holds it), nor for any later look (each FRNCCL_COORD_CHECK_MS, here
    0.1 s, printed another backtrace before)."""
    stay_s = 3.0
    job = run_ranks("reliability.py", 2, "host_leaves", str(tmp_path), str(stay_s), timeout=90,
                    env=fault_env(tmp_path))
    log = job.describe()
    job.assert_ok()
    out = job.ranks[1].output
    assert "Exception raised from" not in out and "frame #" not in out, f"torch's warning printed\n{log}"
    lines = [ln for ln in out.splitlines() if ln.startswith("[frnccl rank 1] store unreachable")]
    assert lines and lines[0].endswith("job-wide dump requests will not reach this rank"), log
    # The dump signal's job-wide request is served locally, and says why, without touching the store.
    assert any(ln.endswith("(its connection was lost earlier); dumping this rank only") for ln in lines), log
    result = job.results()[1]
    assert len(result["signalled"]) == 1 and result["signalled"][0].endswith("-local"), result
    assert not result["local"].startswith("FAILED") and Path(result["local"], "pickle", "frnccl_rank_1").is_file(), result


def test_store_host_killed_during_dump(tmp_path):
    """Rank 1 asks for a job-wide dump; rank 0 (the store host) is slow to write its part (BIG_ENTRIES) and is
    killed while at it. The trigger stops waiting for the store; the survivors keep their part of the incident,
    then dump locally when their next op fails, and exit by themselves."""
    survivors = [1, 2]
    dump_dir = tmp_path / "dumps"
    bg = Ranks(tmp_path, 3, "loop", str(BIG_ENTRIES), "0", env=fault_env(tmp_path))
    try:
        bg.wait_running()
        os.kill(bg.pid(1), signal.SIGUSR1)

        def survivors_wrote() -> bool:
            folders = [f for f in incident_folders(dump_dir) if "-signal-r1" in f.name]
            return bool(folders) and all((folders[0] / "pickle" / f"frnccl_rank_{r}").exists() for r in survivors)

        wait_for(survivors_wrote, 30, "ranks 1 and 2 to write their part", bg)
        incident = [f for f in incident_folders(dump_dir) if "-signal-r1" in f.name][0]
        assert not (incident / "pickle" / "frnccl_rank_0").exists(), "rank 0 was not slow enough to kill it mid-dump"
        os.kill(bg.pid(0), signal.SIGKILL)
        t_kill = time.monotonic()
    finally:
        bg.stop()
    job = bg.finish()
    log = job.describe()
    check_survivors(job, t_kill, survivors, log)
    files = check_final_files_whole(dump_dir, log)
    pickles = sorted(p.name for p in (incident / "pickle").iterdir() if not p.name.startswith("."))
    assert pickles == [f"frnccl_rank_{r}" for r in survivors], (pickles, log)
    for r in survivors:
        assert files[incident / "pickle" / f"frnccl_rank_{r}"]["dump_reason"] == "signal"
        assert len(local_folders(dump_dir, r)) == 1, f"rank {r} dumps locally once its op fails\n{log}"
    # The trigger says how its wait ended: the store went away, or the deadline passed with rank 0 missing.
    trigger_out = job.ranks[1].output
    assert (f"store unreachable while waiting for dump {incident.name}" in trigger_out
            or re.search(rf"dump {re.escape(incident.name)}: 2/3 ranks wrote", trigger_out)), log


# ----------------------------------------------------------------------------- 4. a dump folder that cannot be written


UNWRITABLE_OPS = 50  # all_reduces before and after the failed dumps: enough entries for a dump of > 8 KB


def _mount_tiny_tmpfs(where: Path) -> None:
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True,
                          text=True, timeout=30)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a 64 KB tmpfs here: {proc.stderr.strip()}")


def _umount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def unwritable_jobs(tmp_path_factory):
    """Runs each case's job once per module (the count test below reuses one)."""
    cache: dict[str, dict[str, Any]] = {}

    def run(case: str) -> dict[str, Any]:
        if case in cache:
            return cache[case]
        tmp_path = tmp_path_factory.mktemp(f"unwritable_{case}")
        extra: dict[str, str] = {}
        mounted = None
        if case == "under_a_file":  # mkdir fails with ENOTDIR
            (tmp_path / "a_file").write_text("not a folder")
            dump_dir = tmp_path / "a_file" / "dumps"
        elif case == "proc":  # mkdir fails with ENOENT: nothing can be created under /proc/self
            dump_dir = Path("/proc/self/frnccl-dumps")
        elif case == "full_tmpfs":  # ENOSPC: 64 KB of room, the dumps are larger
            mounted = tmp_path / "tiny"
            _mount_tiny_tmpfs(mounted)
            dump_dir = mounted / "dumps"
        elif case == "file_size_limit":  # EFBIG: RLIMIT_FSIZE of 8 KB in the ranks, SIGXFSZ ignored
            dump_dir = tmp_path / "dumps"
            extra["RELIABILITY_FSIZE"] = "8192"
        else:
            raise AssertionError(case)
        try:
            job = run_ranks("reliability.py", 2, "unwritable", str(tmp_path), str(UNWRITABLE_OPS), timeout=120,
                            env={**fault_env(tmp_path, **extra), "FRNCCL_DUMP_DIR": str(dump_dir)})
            # Looked at before the tmpfs goes away.
            leftovers = {"partial": partial_files(dump_dir), "final": final_files(dump_dir)}
            loaded = check_final_files_whole(dump_dir, job.describe())
        finally:
            if mounted is not None:
                _umount(mounted)
        cache[case] = {"job": job, "dump_dir": dump_dir, "leftovers": leftovers, "loaded": loaded, "log": job.describe()}
        return cache[case]

    return run


@pytest.mark.parametrize("case", ["under_a_file", "proc", "full_tmpfs", "file_size_limit"])
def test_unwritable_dump_dir(unwritable_jobs, case):
    """Dumps that cannot be written: each rank logs one clear line per failed dump (the path and the system's
    reason), fr_backend.dump() raises, collectives go on with the right results, every rank exits 0, and no
    temporary file is left (a format written before the disk filled up stays whole)."""
    res = unwritable_jobs(case)
    job, log, dump_dir = res["job"], res["log"], res["dump_dir"]
    assert not job.timed_out and job.elapsed_s < 90, log
    job.assert_ok()
    reason = {"under_a_file": "Not a directory", "proc": "No such file or directory",
              "full_tmpfs": "No space left on device", "file_size_limit": "File too large"}[case]
    for r, result in enumerate(job.results()):
        assert result["ops_ok"] and result["ops"] == 2 * UNWRITABLE_OPS + 2, result
        out = job.ranks[r].output
        assert "LOCAL_DUMP_FAILED frnccl: dump failed" in out, f"fr_backend.dump() must raise\n{log}"
        failed = [m for m in NOT_WRITTEN_RE.finditer(out) if int(m.group(1)) == r]
        # The local dump and the job-wide one (SIGUSR1 on rank 0): one line each, naming the path and why.
        assert len(failed) == 2, f"rank {r}: want 2 'NOT written' lines\n{log}"
        for m in failed:
            assert m.group(3).startswith(str(dump_dir)) and m.group(4) == reason, m.group(0)
    assert not res["leftovers"]["partial"], res["leftovers"]
    if case != "full_tmpfs":
        assert not res["leftovers"]["final"], res["leftovers"]
    # full_tmpfs: a pickle that fit before the disk filled up may stay; check_final_files_whole loaded it whole.


def test_unwritable_dump_dir_count_is_honest(unwritable_jobs):
    res = unwritable_jobs("under_a_file")
    counts = [(m.group(2), m.group(3)) for m in WROTE_RE.finditer(res["log"])]
    assert counts, res["log"]
    assert counts == [("0", "2")], f"no rank wrote a file, yet the trigger logged {counts}"


# ----------------------------------------------------------------------------- 5. many dump requests at once


def test_request_queued_behind_an_incident_does_not_spin(tmp_path):
    """fr_backend.dump() while a job-wide dump waits its deadline for a rank that cannot write: the call is
    served once that wait ends, and the monitor sleeps meanwhile. It used to poll the store in a tight loop
    (its pause ended at once while a request was queued): about 0.9 s of CPU per second of wait."""
    dump_timeout_s = 6
    job = run_ranks("reliability.py", 2, "queued_dump", str(tmp_path), timeout=90,
                    env=fault_env(tmp_path, FRNCCL_DUMP_TIMEOUT_SEC=str(dump_timeout_s)))
    log = job.describe()
    job.assert_ok()
    result = job.results()[0]
    assert not result["dump"].startswith("FAILED"), log
    assert result["wall_s"] > 2, f"the dump did not wait behind the incident: {result}\n{log}"
    assert result["cpu_s"] < 0.25 * result["wall_s"], f"the monitor spun while the dump waited: {result}\n{log}"


def test_stale_lock_is_taken_over(tmp_path):
    """A fresh-looking `frnccl/active` that no request follows (its trigger ended before asking, or asked before
    these processes joined the store) must not swallow the next incident. Both ranks time out at about the same
    time and join it; once its request is kJoinedRequestGraceMs (10 s) late, they take it over: one of them wins
    and triggers, the other joins that incident, so there is exactly one incident, both ranks dump, and the
    timeout aborts the groups as usual. Before, they waited for that request forever: nothing was dumped and the
    groups were never aborted."""
    dump_dir = tmp_path / "dumps"
    # Long enough that the seeded lock does not go stale by age (two dump deadlines) before the grace ends.
    dump_timeout_s, pg_timeout_s = 20, 3
    job = run_ranks("reliability.py", 2, "stale_lock", str(tmp_path), timeout=150,
                    env=fault_env(tmp_path, FRNCCL_DUMP_TIMEOUT_SEC=str(dump_timeout_s),
                                  RELIABILITY_PG_TIMEOUT=str(pg_timeout_s), RELIABILITY_NEXT_CALLS_S="40"))
    log = job.describe()
    job.assert_ok()
    folders = incident_folders(dump_dir)
    assert len(folders) == 1, f"want one incident, got {[f.name for f in folders]}\n{log}"
    folder = folders[0]
    assert rank_files(folder) == {"json": ["frnccl_rank_0.json", "frnccl_rank_1.json"],
                                  "pickle": ["frnccl_rank_0", "frnccl_rank_1"]}, log
    trigger = int(re.fullmatch(r".*-timeout-r(\d+)(?:-\d+)?", folder.name).group(1))
    assert re.search(rf"\[frnccl rank {trigger}\] incident 20261201-000000.000-timeout-r1 never asked this rank to dump "
                     r"\(its lock was taken [0-9.]+ s ago, .*; taking the incident over", log), log
    for r in range(2):
        d = fr_backend.load_dump(str(folder / "pickle" / f"frnccl_rank_{r}"))
        assert d["incident_id"] == folder.name and d["trigger_rank"] == trigger, (r, d["incident_id"], d["trigger_rank"])
        assert d["dump_reason"] == "timeout", (r, d["dump_reason"], d["dump_detail"])
    assert [(m.group(1), m.group(2), m.group(3)) for m in WROTE_RE.finditer(log)] == [(folder.name, "2", "2")], log
    for r, result in enumerate(job.results()):
        out = job.ranks[r].output
        assert f"OUTCOME {r} raised DistBackendError" in out and "timed out after" in out, log
        assert result["aborted"], f"rank {r}: the timeout did not abort the groups\n{log}"
        assert re.search(rf"NEXT_CALL {r} raised DistBackendError: .*; dump {re.escape(folder.name)} is written and every "
                         r"frnccl group of this process was aborted", out), log


def test_concurrent_dump_requests(tmp_path):
    """At one instant: SIGUSR1 to every rank, a `frnccl dump` request (its request_dump(), in this process so
    that it starts at the same instant as the signals) and fr_backend.dump() on rank 1. The job-wide requests
    make one incident with exactly one file per rank per format; fr_backend.dump() makes its own local incident
    (rank 1 only); the job goes on and exits 0. Each rank holds 2000 deep-stack entries, so every dump takes a
    while and the requests overlap."""
    import torch.distributed  # noqa: F401  (what request_dump() imports first: seconds that would make it late)

    from fr_backend import live_dump

    world, local_rank = 3, 1
    dump_dir = tmp_path / "dumps"
    bg = Ranks(tmp_path, world, "loop", "2000", env=fault_env(tmp_path, FRNCCL_DUMP_TIMEOUT_SEC="30"))
    cli: dict[str, Any] = {}
    try:
        bg.wait_running()
        endpoint = f"127.0.0.1:{(bg.state / 'master_port').read_text()}"
        pids = [bg.pid(r) for r in range(world)]
        go = threading.Barrier(world + 2)

        def signal_rank(pid: int) -> None:
            go.wait(10)
            os.kill(pid, signal.SIGUSR1)

        def local_dump() -> None:
            go.wait(10)
            (bg.state / f"local_{local_rank}").write_text("1")

        def cli_dump() -> None:
            go.wait(10)
            try:
                cli["result"] = live_dump.request_dump(endpoint, "concurrent test", 0, 30)
            except live_dump.LiveDumpError as err:
                cli["error"] = str(err)

        actors = [threading.Thread(target=signal_rank, args=(p,)) for p in pids]
        actors += [threading.Thread(target=local_dump), threading.Thread(target=cli_dump)]
        for a in actors:
            a.start()
        for a in actors:
            a.join(60)
        assert not any(a.is_alive() for a in actors), "a request did not return within 60 s"

        def settled() -> bool:
            folders = incident_folders(dump_dir)
            files = [p for f in folders for p in f.rglob("frnccl_rank_*")]
            return len(folders) >= 2 and len(files) >= 2 * world + 2
        wait_for(settled, 60, "every requested dump", bg)
        time.sleep(2.0)  # a late duplicate incident would show up in this time
    finally:
        bg.stop()
    job = bg.finish()
    log = job.describe() + f"\nCLI: {cli}"
    job.assert_ok()

    local = re.findall(r"^LOCAL_DUMP (\S+)$", job.ranks[local_rank].output, re.M)
    assert len(local) == 1, log
    local_folder = Path(local[0])
    folders = incident_folders(dump_dir)
    job_wide = [f for f in folders if f != local_folder]
    assert local_folder in folders and len(job_wide) == 1, f"want one job-wide incident: {[f.name for f in folders]}\n{log}"
    incident = job_wide[0]
    assert rank_files(incident) == {"json": [f"frnccl_rank_{r}.json" for r in range(world)],
                                    "pickle": [f"frnccl_rank_{r}" for r in range(world)]}, (rank_files(incident), log)
    assert rank_files(local_folder) == {"json": [f"frnccl_rank_{local_rank}.json"],
                                        "pickle": [f"frnccl_rank_{local_rank}"]}, log
    dumps = check_final_files_whole(dump_dir, log)
    assert {d["incident_id"] for p, d in dumps.items() if p.parent.parent == incident} == {incident.name}
    for r in range(world):
        wrote = re.findall(rf"^\[frnccl rank {r}\] wrote dump {re.escape(incident.name)} ", job.ranks[r].output, re.M)
        assert len(wrote) == 1, f"rank {r} must write the incident once\n{log}"
    if "result" in cli:  # the CLI won the race: every signal joined its incident
        got = cli["result"]
        folder, written, total = got.folder, got.written, got.world
        assert Path(folder).name == incident.name and (written, total) == (world, world), log
    else:  # a signal won: the CLI was told which incident is in progress
        assert f"incident {incident.name} is already being dumped" in cli.get("error", ""), log
        m = [m for m in WROTE_RE.finditer(log) if m.group(1) == incident.name]
        assert len(m) == 1 and (m[0].group(2), m[0].group(3)) == (str(world), str(world)), log


# ----------------------------------------------------------------------------- 6. many threads, many groups


def test_threads_on_separate_groups_recorded_once(tmp_path):
    """8 threads per rank, each issuing 200 collectives (all_reduce, broadcast, all_gather, async all_reduce) on a
    group of its own, all at once, on 2 ranks. Afterwards fr_backend.trace_entries() holds every op exactly once:
    per group, collective_seq_id runs 1..200 with no gap and no repeat, every entry names the thread that issued
    it, and record ids are unique across the process."""
    groups, ops = 8, 200
    job = run_ranks("reliability.py", 2, "threads", str(tmp_path), str(groups), str(ops), timeout=240,
                    env={"FRNCCL_DUMP_DIR": str(tmp_path / "dumps")})
    log = job.describe()
    assert not job.timed_out, log
    results = job.results()
    job.assert_ok()
    for res in results:
        assert not res["errors"] and not res["wrong"] and not res["alive"], res
        assert res["entries"] == groups * ops, f"rank {res['rank']}: {res['entries']} entries for {groups * ops} ops"
        assert len(set(res["record_ids"])) == len(res["record_ids"]), "record ids repeat"
        assert res["record_ids"] == sorted(res["record_ids"]), "the ring is not in record order"
        issuers = set()
        for i, g in res["groups"].items():
            assert g["seqs"] == list(range(1, ops + 1)), f"rank {res['rank']} group {i}: seqs {g['seqs'][:10]}..."
            assert g["thread_ids"] == [g["issuer"]], (i, g["thread_ids"], g["issuer"])
            assert g["ops"] == ["gloo:all_gather", "gloo:all_reduce", "gloo:broadcast"], g["ops"]
            issuers.add(g["issuer"])
        assert len(issuers) == groups, "every group had its own thread"
        assert len({g["name"] for g in res["groups"].values()}) == groups


# ----------------------------------------------------------------------------- 7. bad configuration


# Every setting of fr_backend.config.SETTINGS -> values frnccl must refuse. The first one is also tried through a
# real init_process_group. "{file}" stands for a path that is a regular file, "{dir}" for a folder. Strings with "\udcff" are what
# os.environ holds for a byte that is not UTF-8 (the process test passes the raw byte).
HUGE = "99999999999999999999"  # does not fit an int64: once slipped through to a pybind11 cast error
BAD_VALUES: dict[str, list[str]] = {
    "FRNCCL_BUFFER_SIZE": [HUGE, "abc", "-1", "1.5", str(frconfig.MAX_BUFFER_SIZE + 1)],
    "FRNCCL_STACKS": ["java", "python,cpp"],
    "FRNCCL_DUMP_DIR": ["{file}", "/tmp/dumps-\udcff"],
    "FRNCCL_VERDICT_FILE": ["{dir}", "/tmp/verdict-\udcff"],
    "FRNCCL_DUMP_FORMATS": ["xml", ",", "pickle;json"],
    "FRNCCL_DUMP_TIMEOUT_SEC": [HUGE, "0", "-5", "1.5", str(7 * 24 * 3600 + 1)],
    "FRNCCL_DUMP_MIN_INTERVAL_SEC": [HUGE, "-1", "10s", str(7 * 24 * 3600 + 1)],
    "FRNCCL_DUMP_MAX_COUNT": [HUGE, "-1", "many", str(frconfig.MAX_DUMP_COUNT + 1)],
    "FRNCCL_COORD_CHECK_MS": [HUGE, "9", "abc"],
    "FRNCCL_HEARTBEAT_TIMEOUT_SEC": [HUGE, "-1", "8h"],
    "FRNCCL_WATCHDOG_POLL_MS": [HUGE, "0", "fast"],
    "FRNCCL_SYMBOLIZE_TIMEOUT_MS": [HUGE, "-1", "2s"],
    "FRNCCL_ON_TIMEOUT": ["abort", "1"],
    "FRNCCL_DUMP_SIGNAL": ["SIGTERM", "SIGKILL", "SIGFOO", "65", "\u00b2", "32", "33"],
    "FRNCCL_DUMP_ON_TEARDOWN": ["2", "maybe"],
    "FRNCCL_DUMP_ON_TERMINATE_MS": [HUGE, "-1", "1s", str(frconfig.MAX_TERMINATE_DUMP_MS + 1)],
    "FRNCCL_DUMP_ON_EXCEPTION_MS": [HUGE, "-1", "3s", str(frconfig.MAX_TERMINATE_DUMP_MS + 1)],
    "FRNCCL_GPU_TIMING": [HUGE, "sometimes", "-3", "\u00b2"],
    "FRNCCL_END_EVENT_INTERVAL_US": [HUGE, "-1", "1ms", str(frconfig.MAX_END_EVENT_INTERVAL_US + 1)],
    "FRNCCL_SETTLE_BY_TORCH_WATCHDOG": ["2", "auto"],
    "FRNCCL_JOB_ID": ["job-\udcff"],
}
BAD_CASES = [(name, value) for name, values in BAD_VALUES.items() for value in values]


def _bad(value: str, tmp_path: Path) -> str:
    if value == "{file}":
        path = tmp_path / "a_file"
        path.write_text("not a folder")
        return str(path)
    if value == "{dir}":
        return str(tmp_path)
    return value


# Settings whose bad value must not stop init: the job runs as if they were unset (test_enable.py checks that).
RUNS_AS_UNSET = {"FRNCCL_ENABLE"}


# Settings whose bad value never stops init: the rank says one line and runs without metrics (test_metrics.py
# runs jobs with them); `frnccl config` still reports each, with the settings that make it read.
GOES_ON_WITH_A_LINE = {
    "FRNCCL_METRICS_PORT": ({}, ["http", "70000", "0"]),
    "FRNCCL_METRICS_ADDR": ({"FRNCCL_METRICS_PORT": "9500"}, ["localhost:80", "node-01", "999.1.1.1"]),
    "FRNCCL_METRICS_DIR": ({}, ["/tmp/metrics-\udcff"]),
    "FRNCCL_METRICS_INTERVAL_SEC": ({"FRNCCL_METRICS_PORT": "9500"}, ["0", "nan", "5s", "7200"]),
    "FRNCCL_SLOW_DETECT": ({}, ["maybe", "2"]),
    "FRNCCL_SLOW_WINDOW_SEC": ({}, ["0", "nan", "10s", "7200", "inf"]),
    "FRNCCL_SLOW_MIN_SHARE": ({}, ["0", "2", "-0.1", "x"]),
}


def test_every_setting_has_bad_values():
    assert set(BAD_VALUES) | RUNS_AS_UNSET | set(GOES_ON_WITH_A_LINE) == {s.name for s in frconfig.SETTINGS}, \
        "a setting was added or removed: list its bad values"


@pytest.mark.parametrize("name,value", [(n, v) for n, (_, vs) in GOES_ON_WITH_A_LINE.items() for v in vs])
def test_bad_metrics_setting_is_reported_and_never_stops_init(name, value):
    context = GOES_ON_WITH_A_LINE[name][0]
    env = {**context, name: value}
    frconfig.FrConfig.from_env(env)  # init's own settings are unaffected
    problems = frconfig.validate_environment(env)
    assert len(problems) == 1 and problems[0].startswith(name + " ") and "\n" not in problems[0], problems
    assert frconfig.validate_environment(context) == []


@pytest.mark.parametrize("name,value", BAD_CASES, ids=[f"{n}={v!r}" for n, v in BAD_CASES])
def test_bad_value_parsing(name, value, tmp_path):
    """FrConfig.from_env (what init_process_group runs) and validate_environment (`frnccl config`) both refuse it
    with one line that names the variable."""
    env = {name: _bad(value, tmp_path)}
    with pytest.raises(frconfig.ConfigError) as info:
        frconfig.FrConfig.from_env(env)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert message.startswith(name + " ") and "\n" not in message, message
    problems = frconfig.validate_environment(env)
    assert problems == [message], problems


@pytest.mark.parametrize("name", list(BAD_VALUES))
def test_bad_value_stops_real_init(name, tmp_path):
    """An unmodified script (workers/plain_script.py) on 2 env:// ranks with a real TCPStore, given the bad value:
    init_process_group raises ConfigError, uncaught, so each rank ends promptly with exit status 1 and the last
    line of its output is `fr_backend.config.ConfigError: <the one-line message>`, with no C++ backtrace."""
    value = _bad(BAD_VALUES[name][0], tmp_path)
    with pytest.raises(frconfig.ConfigError) as info:
        frconfig.FrConfig.from_env({name: value})
    want = f"fr_backend.config.ConfigError: {info.value}"
    job = run_ranks("plain_script.py", 2, timeout=90,
                    env={"FRNCCL_DUMP_DIR": str(tmp_path / "dumps"), name: os.fsencode(value)})  # type: ignore[dict-item]
    log = job.describe()
    assert not job.timed_out and job.elapsed_s < 60, f"init with a bad {name} must fail fast\n{log}"
    for r in job.ranks:
        assert r.returncode == 1, log
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert lines and lines[-1] == want, f"rank {r.rank}: want last line {want!r}\n{log}"
        assert sum(ln.startswith("fr_backend.config.ConfigError") for ln in lines) == 1, log
        assert "Exception raised from" not in r.output and "frame #" not in r.output, log
        assert not r.output.startswith("OK ") and "\nOK " not in r.output, log
    assert not (tmp_path / "dumps").exists()


def test_libc_reserved_dump_signals_are_refused():
    """Every signal between the kernel's first real-time signal and the C library's SIGRTMIN (32 and 33 with glibc)
    is refused, and the first one programs may use is accepted: the bound is the runtime SIGRTMIN, not a number."""
    reserved = [n for n in range(1, signal.NSIG) if n not in signal.valid_signals()]
    assert reserved, "this C library reserves no signal: nothing to check"
    for number in reserved:
        with pytest.raises(frconfig.ConfigError, match=f"SIGRTMIN, {int(signal.SIGRTMIN)} here"):
            frconfig.FrConfig.from_env({"FRNCCL_DUMP_SIGNAL": str(number)})
    assert frconfig.FrConfig.from_env({"FRNCCL_DUMP_SIGNAL": str(int(signal.SIGRTMIN))}).dump_signal == signal.SIGRTMIN


# The pair from a real job: the idle watchdog beat every 5 s, and the monitor ended the healthy, idle rank as
# watchdog_stuck after 2 s.
IDLE_POLL_PAST_HEARTBEAT = {"FRNCCL_WATCHDOG_POLL_MS": "5000", "FRNCCL_HEARTBEAT_TIMEOUT_SEC": "2"}


def test_heartbeat_timeout_must_span_the_idle_poll(tmp_path):
    """A heartbeat timeout shorter than a few of the idle watchdog's pauses would end a healthy job that sits idle:
    the pair is refused with one line that names both settings and what would do, by FrConfig.from_env, by
    `frnccl config`, and by a real init_process_group (2 env:// ranks exit 1, last line the error). Each value alone
    is fine, and so are the defaults with either one."""
    with pytest.raises(frconfig.ConfigError) as info:
        frconfig.FrConfig.from_env(IDLE_POLL_PAST_HEARTBEAT)
    message = str(info.value)
    assert message.startswith("FRNCCL_HEARTBEAT_TIMEOUT_SEC (2 s) ") and "FRNCCL_WATCHDOG_POLL_MS (5000 ms)" in message
    assert "FRNCCL_HEARTBEAT_TIMEOUT_SEC to 50 or more" in message and "\n" not in message, message
    assert frconfig.validate_environment(IDLE_POLL_PAST_HEARTBEAT) == [message]
    for name, value in IDLE_POLL_PAST_HEARTBEAT.items():
        assert frconfig.validate_environment({name: value}) == [], name
    assert frconfig.FrConfig.from_env({**IDLE_POLL_PAST_HEARTBEAT, "FRNCCL_HEARTBEAT_TIMEOUT_SEC": "0"})
    assert frconfig.FrConfig.from_env({**IDLE_POLL_PAST_HEARTBEAT, "FRNCCL_HEARTBEAT_TIMEOUT_SEC": "50"})
    job = run_ranks("plain_script.py", 2, timeout=90,
                    env={"FRNCCL_DUMP_DIR": str(tmp_path / "dumps"), **IDLE_POLL_PAST_HEARTBEAT})
    log = job.describe()
    assert not job.timed_out, log
    for r in job.ranks:
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.returncode == 1 and lines[-1] == f"fr_backend.config.ConfigError: {message}", log


# ----------------------------------------------------------------------------- 8. soak (short)


def test_soak_short(tmp_path):
    """scripts/soak.py, short: 20,000 collectives per rank on 2 ranks with a 2,000-entry ring (it wraps 10 times).
    After 5,000 warm-up ops: thread and fd counts never change, RSS grows by at most 8 MB, every sampled result
    is right, no dump is written. docs/reliability.md has the 10^6-op run."""
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "soak.py"), "--ops", "20000", "--sample-every", "1000",
           "--warmup", "5000", "--buffer-size", "2000", "--rss-tolerance-mb", "8", "--timeout", "150", "--json", str(out)]
    job = run_commands([cmd], [_env(0, 1, 0, {})], timeout=180)
    log = job.describe()
    assert not job.timed_out and job.ranks[0].returncode == 0, log
    report = json.loads(out.read_text())
    assert report["pass"] and not report["timed_out"] and report["dumps_written"] == [], log
    assert len(report["ranks"]) == 2
    for rank in report["ranks"]:
        samples = rank["samples"]
        assert [s["ops"] for s in samples] == list(range(0, 20001, 1000)), samples
        after = [s for s in samples if s["ops"] >= 5000]
        assert len({s["threads"] for s in after}) == 1, f"threads changed: {[s['threads'] for s in samples]}"
        assert len({s["fds"] for s in after}) == 1, f"open fds changed: {[s['fds'] for s in samples]}"
        growth_mb = (max(s["rss_kb"] for s in after) - after[0]["rss_kb"]) / 1024
        assert growth_mb <= 8, f"rank {rank['rank']}: RSS grew {growth_mb:.1f} MB after warm-up: {[s['rss_kb'] for s in after]}"
        assert all(s["ok"] for s in samples), samples
        assert rank["verdict"]["pass"] and rank["verdict"]["exit_code"] == 0, rank["verdict"]
