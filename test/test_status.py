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
