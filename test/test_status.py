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
