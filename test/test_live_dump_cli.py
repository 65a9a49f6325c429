"""`frnccl dump --store` against a real TCPStore whose values any client of the job could have written:
a world size that is not a number, and a dump lock left behind by a trigger that never asked the ranks
to dump. The command answers in one line, and takes a stale lock over by the ranks' own rule."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

torch_dist = pytest.importorskip("torch.distributed")

PYTHON_DIR = str(Path(__file__).resolve().parent.parent / "python")
ACTIVE, WORLD, SEQ = "frnccl/active", "frnccl/world_size", "frnccl/incident_seq"


@pytest.fixture
def store():
    s = torch_dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    yield s
    del s


def frnccl_dump(store, *args: str, timeout: float = 60) -> tuple[int, str, str, float]:
    """This tree's `frnccl dump` in a child with a hard bound: (rc, stdout, stderr, seconds)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PYTHON_DIR, env.get("PYTHONPATH", "")) if p)
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "fr_backend.cli", "dump", "--store", f"127.0.0.1:{store.port}", *args],
                       capture_output=True, text=True, env=env, timeout=timeout, check=False)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - start


def frnccl_lines(err: str) -> list[str]:
    """What the command itself said (the backend's import may warn that it is not built in this tree)."""
    return [ln for ln in err.splitlines() if ln.startswith("frnccl")]


@pytest.mark.parametrize("value", ["lots", "", "-3", "99999999999999999999", "\x1b[2Jnot a number"])
def test_world_size_not_a_number(store, value):
    store.set(WORLD, value)
    rc, out, err, _ = frnccl_dump(store, "--timeout", "1")
    assert rc == 2 and "Traceback" not in err, err
    lines = frnccl_lines(err)
    assert len(lines) == 1 and WORLD in lines[0] and "--world-size" in lines[0], err
    assert "\x1b" not in err
    assert not store.check([ACTIVE]) and not store.check([SEQ]), "nothing may be requested"


def request_of(store, seq: int) -> list[str]:
    return store.get(f"frnccl/incident/{seq}").decode().split("\n")


def test_stale_lock_is_taken_over(store):
    """A lock taken 60 s ago whose incident never published a request: taken over at once, one request out."""
    store.set(WORLD, "2")
    store.set(ACTIVE, f"20260101-000000-timeout-r1|{time.time_ns() - 60 * 10**9}")
    rc, out, err, _ = frnccl_dump(store, "--timeout", "1", "--reason", "after a crash")
    assert rc == 1 and "0/2 ranks wrote" in out, (rc, out, err)  # no rank runs here: nobody writes
    assert any("took over the dump lock of incident 20260101-000000-timeout-r1" in ln for ln in frnccl_lines(err)), err
    assert int(store.get(SEQ)) == 1
    incident, reason, trigger, detail = request_of(store, 1)
    assert incident.endswith("-manual-cli") and (reason, trigger, detail) == ("manual", "-1", "after a crash")
    assert not store.check([ACTIVE]), "the lock is released when the command ends"


def test_young_lock_is_taken_over_once_10_s_old(store):
    """A lock taken 7 s ago with no request: the command waits until it is 10 s old (its request may still
    come, as the ranks allow), then takes it over."""
    store.set(WORLD, "1")
    store.set(ACTIVE, f"20260101-000000-timeout-r0|{time.time_ns() - 7 * 10**9}")
    rc, out, err, took = frnccl_dump(store, "--timeout", "1")
    assert rc == 1 and any("took over" in ln for ln in frnccl_lines(err)), (rc, out, err)
    assert took >= 2.5, f"took the lock over after {took:.1f} s: it was 7 s old, the rule is 10 s"
    assert request_of(store, 1)[0].endswith("-manual-cli")


def test_lock_of_a_dump_in_progress_is_refused(store):
    """The lock's incident has asked the ranks to dump: a dump is in progress, the command refuses, even when
    the lock is old (a slow dump), and changes nothing."""
    store.set(WORLD, "2")
    held = f"20260101-000000-timeout-r1|{time.time_ns() - 60 * 10**9}"
    store.set(ACTIVE, held)
    store.set(SEQ, "4")
    store.set("frnccl/incident/4", "20260101-000000-timeout-r1\ntimeout\n1\nwatchdog")
    rc, out, err, took = frnccl_dump(store, "--timeout", "1")
    assert rc == 2 and "incident 20260101-000000-timeout-r1 is already being dumped" in err, (rc, err)
    assert store.get(ACTIVE).decode() == held and store.get(SEQ) == b"4"


def test_lock_of_a_dump_long_over_is_taken_over(store):
    """A lock whose request is out but that is older than two dump deadlines: its dump is over (its trigger
    died before letting go), as the ranks judge it."""
    store.set(WORLD, "2")
    store.set(ACTIVE, f"20260101-000000-timeout-r1|{time.time_ns() - 300 * 10**9}")
    store.set(SEQ, "4")
    store.set("frnccl/incident/4", "20260101-000000-timeout-r1\ntimeout\n1\nwatchdog")
    rc, out, err, _ = frnccl_dump(store, "--timeout", "1")
    assert rc == 1 and any("its dump is long over" in ln for ln in frnccl_lines(err)), (rc, out, err)
    assert int(store.get(SEQ)) == 5 and request_of(store, 5)[0].endswith("-manual-cli")


def _ranks_answer(port: int, ranks: list[int], leave_after: list[int] = ()) -> threading.Thread:
    """What the ranks do when asked (simulated on a client of the store): wait for request 1, then each of
    ``ranks`` appends itself to the incident's writers and counts itself written; ``leave_after`` then leave."""
    def run() -> None:
        s = torch_dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30),
                                wait_for_workers=False)
        s.wait(["frnccl/incident/1"])
        incident = s.get("frnccl/incident/1").decode().split("\n")[0]
        for r in ranks:
            s.append(f"frnccl/writers/{incident}", f"{r},")
            s.add(f"frnccl/written/{incident}", 1)
        for r in leave_after:
            s.append("frnccl/left_ranks", f"+{r},")
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_ranks_that_left_end_the_wait(store):
    """World 4: rank 2 left the job before the request, rank 3 left and came back, and entries that name no
    rank of the job are in the list too; ranks 0, 1 and 3 write when asked. The command ends once they have,
    not at its timeout, and names rank 2."""
    store.set(WORLD, "4")
    store.append("frnccl/left_ranks", "+2,+3,+9,junk,+-1,+,-3,")
    ranks = _ranks_answer(store.port, [0, 1, 3])
    rc, out, err, took = frnccl_dump(store, "--timeout", "60", timeout=90)
    ranks.join(30)
    assert rc == 1 and "3/4 ranks wrote; rank 2 had left the job;" in out, (rc, out, err)
    assert took < 30, f"waited {took:.0f} s for a rank that had left"


def test_rank_that_wrote_and_left_is_counted_once(store):
    """World 2: rank 1 writes, then leaves; rank 0 never writes. One rank wrote, none left without writing: the
    command waits for rank 0 until its timeout."""
    store.set(WORLD, "2")
    ranks = _ranks_answer(store.port, [1], leave_after=[1])
    rc, out, err, took = frnccl_dump(store, "--timeout", "4")
    ranks.join(30)
    assert rc == 1 and "1/2 ranks wrote;" in out and "left" not in out, (rc, out, err)
    assert took >= 4


def test_ranks_that_left_are_named_when_the_wait_times_out(store):
    """World 3: rank 2 left the job before the request, rank 0 writes, rank 1 never does. The wait ends at its
    timeout; what it says still names rank 2 as gone (not a rank to look for among the hung ones)."""
    store.set(WORLD, "3")
    store.append("frnccl/left_ranks", "+2,")
    ranks = _ranks_answer(store.port, [0])
    rc, out, err, took = frnccl_dump(store, "--timeout", "4")
    ranks.join(30)
    assert rc == 1 and "1/3 ranks wrote" in out, (rc, out, err)
    assert "rank 2 had left the job" in out, (rc, out, err)


def test_rank_listed_as_writer_before_its_count_is_counted(store):
    """World 2: rank 1 wrote and then left; rank 0 wrote and named itself in the writers (a rank appends there
    before it adds to the count, test_ranks_that_left_end_the_wait's order) but its count is not in yet. The
    wait ends on the lists; what it reports must not say that only one rank wrote, nor exit 1."""
    store.set(WORLD, "2")

    def run() -> None:
        s = torch_dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=timedelta(seconds=30),
                                wait_for_workers=False)
        s.wait(["frnccl/incident/1"])
        incident = s.get("frnccl/incident/1").decode().split("\n")[0]
        s.append(f"frnccl/writers/{incident}", "1,")
        s.add(f"frnccl/written/{incident}", 1)
        s.append("frnccl/left_ranks", "+1,")
        s.append(f"frnccl/writers/{incident}", "0,")  # rank 0: the count comes next, after the CLI's last look

    t = threading.Thread(target=run, daemon=True)
    t.start()
    rc, out, err, took = frnccl_dump(store, "--timeout", "20", timeout=60)
    t.join(30)
    assert took < 15, f"waited {took:.0f} s"
    assert rc == 0 and "2/2 ranks wrote" in out, (rc, out, err)
