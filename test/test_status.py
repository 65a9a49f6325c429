"""`frnccl status --store HOST:PORT [--json]` on a running job: every rank answers with where it is, per group,
and nothing is dumped; bad input gets one line and exit 2. Real torchrun jobs on CPU with a hard time bound."""

from __future__ import annotations

import json
import socket
import threading

from dist_harness import free_port
from test_incidents import WORLD, incident_dirs, run_cli, start_healthy, stop_healthy


def test_status_of_a_running_job(tmp_path):
    bg, state = start_healthy(tmp_path)
    try:
        port = int((state / "master_port").read_text())
        rc, out, took = run_cli("status", "--store", f"127.0.0.1:{port}", "--json", timeout=60)
        rc_text, text, _ = run_cli("status", "--store", f"127.0.0.1:{port}", timeout=60)
    finally:
        job = stop_healthy(bg, state)
    log = f"frnccl status (rc {rc}, {took:.1f}s):\n{out}\n{text}\n{job.describe()}"
    assert rc == 0 and rc_text == 0, log
    got = json.loads(out)
    assert got["world_size"] == WORLD and got["answered"] == list(range(WORLD)) and got["missing"] == [], log
    assert got["seconds"] < 2.0, log
    # The default group is listed by every rank, with the seq each completed last.
    default = [g for g in got["groups"].values() if g["desc"] == "default_pg"]
    assert len(default) == 1 and sorted(default[0]["last_completed"]) == [str(r) for r in range(WORLD)], log
    assert all(c > 0 for c in default[0]["last_completed"].values()), log
    assert text.startswith(f"frnccl status: {WORLD}/{WORLD} ranks answered"), log
    # Asking writes no dump and opens no incident.
    assert incident_dirs(tmp_path / "dumps") == [], log
    assert "asking all" not in job.describe() and "wrote dump" not in job.describe(), log


def test_status_bad_input(tmp_path):
    # Nothing listens there.
    rc, out, _ = run_cli("status", "--store", f"127.0.0.1:{free_port()}", timeout=60)
    assert rc == 2 and len(out.strip().splitlines()) == 1 and "cannot reach the store" in out, out
    rc, out, _ = run_cli("status", "--store", "no-port-here", timeout=60)
    assert rc == 2 and len(out.strip().splitlines()) == 1 and "HOST:PORT" in out, out
    # A store that is not a frnccl job's, then one whose job size is not a number.
    from torch.distributed import TCPStore

    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    rc, out, _ = run_cli("status", "--store", f"127.0.0.1:{port}", timeout=60)
    assert rc == 2 and len(out.strip().splitlines()) == 1 and "no frnccl job" in out, out
    store.set("frnccl/world_size", "\x1b[2Jmany")
    rc, out, _ = run_cli("status", "--store", f"127.0.0.1:{port}", timeout=60)
    assert rc == 2 and len(out.strip().splitlines()) == 1 and "not a number" in out and "\x1b" not in out, out
    # Ranks that never answer: named, exit 1, within the timeout.
    store.set("frnccl/world_size", "3")
    rc, out, took = run_cli("status", "--store", f"127.0.0.1:{port}", "--json", "--timeout", "1", timeout=60)
    assert rc == 1 and json.loads(out)["missing"] == [0, 1, 2] and took < 30, out


# A simulated job's ranks, in a process of their own: once `frnccl status` asks (frnccl/status/seq), each rank in
# argv[3] (a "lo-hi" range) answers as the monitor's answerStatus does, under frnccl/status/rank/<rank>.
_ANSWERER = """
import json, sys, time
from datetime import timedelta
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=timedelta(seconds=60), wait_for_workers=False)
world = int(sys.argv[2])
lo, hi = map(int, sys.argv[3].split("-"))
print("READY", flush=True)
deadline = time.monotonic() + 60
while not store.check(["frnccl/status/seq"]) and time.monotonic() < deadline:
    time.sleep(0.01)
n = int(store.get("frnccl/status/seq"))
ranks = range(lo, hi)
store.multi_set([f"frnccl/status/rank/{r}" for r in ranks],
                [json.dumps({"n": n, "summary": {"v": 1, "rank": r, "world_size": world, "groups": []}}) for r in ranks])
print("ANSWERED", n, flush=True)
"""


def test_status_reads_a_partial_answer_without_a_round_trip_per_rank_each_poll(tmp_path, monkeypatch):
    """Ranks that have not answered yet cost one check per batch of keys and poll, not one per rank: at
    16,384 ranks, a check per rank per poll is seconds of the store's time while the answers come in."""
    import subprocess
    import sys

    from torch.distributed import TCPStore

    from fr_backend import status

    world, answering = 2048, (0, 1100)  # the second batch of 1,024 keys never becomes whole
    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    store.set("frnccl/world_size", str(world))
    answerer = subprocess.Popen([sys.executable, "-c", _ANSWERER, str(port), str(world), "%d-%d" % answering],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = answerer.stdout.readline()  # torch's import takes seconds on a loaded machine: ask once it listens
    single_checks = []
    opened = status.open_job

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def check(self, keys):
            if len(keys) == 1 and keys[0].startswith("frnccl/status/rank/"):
                single_checks.append(keys[0])
            return self.inner.check(keys)

    def counting_open(endpoint, world_size):
        got, size = opened(endpoint, world_size)
        return Counting(got), size

    monkeypatch.setattr(status, "open_job", counting_open)
    try:
        assert first == "READY\n", first + answerer.communicate(timeout=60)[0]
        st = status.ask(f"127.0.0.1:{port}", 0, 5.0)
    finally:
        try:
            out, _ = answerer.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            answerer.kill()
            out, _ = answerer.communicate()
    log = f"answerer rc {answerer.returncode}: {out[-2000:]}\nper-rank checks: {len(single_checks)}"
    assert answerer.returncode == 0 and "ANSWERED 1" in out, log
    # Every answer is read, the ones of the batch that never became whole too.
    assert sorted(st.answered) == list(range(*answering)), log
    assert st.missing() == list(range(answering[1], world)), log
    # Rank by rank only once, on the last poll, and only for the batch that is not whole.
    assert 0 < len(single_checks) <= status.READ_BATCH, log
    assert len(set(single_checks)) == len(single_checks), log


def _summary(rank: int, world: int, **extra) -> dict:
    return {"v": 1, "rank": rank, "world_size": world, "host": "h", "pid": 1, "state": "live",
            "groups": [{"pg": "0", "desc": "default_pg", "completed": {"seq": 5}}], **extra}


def test_status_hostile_answers(tmp_path):
    """Answers any store client could have written: fields of the wrong type, names with control characters,
    JSON nested past the parser's depth, a rank of a job of another size; bad --timeout values. Each is one
    line (exit 2) or is skipped; nothing reaches the terminal unescaped and nothing raises a traceback."""
    from torch.distributed import TCPStore

    port = free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    store.set("frnccl/world_size", "3")
    future = 10**6  # an answer to a newer request than the CLI's own counts too
    evil = {"pg": "\x1b[31mred", "desc": ["x"], "completed": {"seq": "9"},
            "in_flight": {"op": "\x1b[2Jall_reduce", "seq": "4", "created_ns": "soon"}}
    store.set("frnccl/status/rank/0", json.dumps({"n": future, "summary": _summary(0, 3, groups=[evil, 7])}))
    store.set("frnccl/status/rank/1", "[" * 8000)
    store.set("frnccl/status/rank/2", json.dumps({"n": future, "summary": _summary(2, 3)}))
    for args in ((), ("--json",)):
        rc, out, _ = run_cli("status", "--store", f"127.0.0.1:{port}", "--timeout", "1", *args, timeout=60)
        assert rc == 1 and "\x1b" not in out and "Traceback" not in out, out
        assert ("\\x1b[31mred" in out) and ("did not answer: ranks 1" in out or '"missing": [1]' in out), out
    store.set("frnccl/status/rank/2", json.dumps({"n": future, "summary": _summary(2, 5)}))
    rc, out, _ = run_cli("status", "--store", f"127.0.0.1:{port}", "--timeout", "5", timeout=60)
    assert rc == 2 and len(out.strip().splitlines()) == 1 and "job of 5 ranks" in out, out
    rc, out, _ = run_cli("status", "--store", f"127.0.0.1:{port}", "--world-size", "4", timeout=60)
    assert rc == 2 and len(out.strip().splitlines()) == 1 and "does not match" in out, out
    for bad in ("0", "-1", "inf", "nan", "601"):
        rc, out, _ = run_cli("status", "--store", f"127.0.0.1:{port}", "--timeout", bad, timeout=60)
        assert rc == 2 and len(out.strip().splitlines()) == 1 and "--timeout" in out, (bad, out)
    # The job's status counter set to something that is not a number: the store refuses the add; one line.
    store.set("frnccl/status/seq", "many")
    rc, out, _ = run_cli("status", "--store", f"127.0.0.1:{port}", "--timeout", "1", timeout=60)
    assert rc == 2 and len(out.strip().splitlines()) == 1 and "Traceback" not in out, out
