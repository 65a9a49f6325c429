"""How long a failing wait() takes to raise past the inner backend's own error while its incident's verdict is
late or never comes. Usage: verdict_wait_latency.py PG_TIMEOUT_S late|manual

Rank 2 stops itself (SIGSTOP) instead of entering an all_reduce of a group with a short timeout; ranks 0 and 1
enter it and time out. Their incident's trigger then waits for rank 2's part up to the dump deadline before it
computes the verdict: the victims' errors must not wait for it (the verdict follows in the trigger's log).
"manual": once rank 2 stopped, rank 0 asks the job to dump with the dump signal (a manual incident, which never
gets a verdict and waits for rank 2 up to the deadline) before the victims enter: their failure joins it.
Each victim reports how long past the timeout its error came; rank 0 then lets rank 2 go on (SIGCONT): it
writes its part and ends, and the job ends cleanly.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import fr_backend
from _worker import RANK, Checks, finish, init

PG_TIMEOUT_S = float(sys.argv[1])
MODE = sys.argv[2]

init("frnccl")
checks = Checks()
store = dist.distributed_c10d._get_default_store()
t = torch.ones(4)
dist.all_reduce(t)
short = dist.new_group(timeout=timedelta(seconds=PG_TIMEOUT_S))
dist.all_reduce(t, group=short)
if RANK == 2:
    store.set("stopped_pid", str(os.getpid()))
    os.kill(os.getpid(), signal.SIGSTOP)
    finish(checks, destroy=False)  # once rank 0 let it go on
    sys.exit(0)
if MODE == "manual":
    if RANK == 0:
        store.wait(["stopped_pid"], timedelta(seconds=60))
        os.kill(os.getpid(), signal.SIGUSR1)  # FRNCCL_DUMP_SIGNAL: the whole job dumps
    deadline = time.monotonic() + 60
    while not fr_backend._C.incident_verdict()[0] and time.monotonic() < deadline:
        time.sleep(0.05)  # the request reaches this rank's monitor
    checks.expect("manual_incident_noted", bool(fr_backend._C.incident_verdict()[0]), "no incident within 60 s")
start = time.monotonic()
try:
    dist.all_reduce(t, group=short)
    checks.fail("raised", "the all_reduce rank 2 never entered completed")
except Exception as err:  # noqa: BLE001 - what the caller gets
    waited = time.monotonic() - start
    checks.notes["error"] = str(err)
    checks.notes["past_timeout_s"] = waited - PG_TIMEOUT_S
store.add("measured", 1)
if RANK == 0:
    while store.add("measured", 0) < 2:
        store.wait(["measured"], timedelta(seconds=60))  # the key exists: returns at once; the loop polls the count
        time.sleep(0.05)
    os.kill(int(store.get("stopped_pid")), signal.SIGCONT)
finish(checks, destroy=False)
