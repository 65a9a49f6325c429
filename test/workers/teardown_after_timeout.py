"""A timeout right before teardown. Usage: teardown_after_timeout.py race|pending|left

Rank 0 alone calls barrier() on a group with a 1 s timeout, catches the error, and calls
destroy_process_group() at once. Rank 1 shuts down cleanly; when is what the mode says:
  race:    as soon as rank 0 says, through the store, that its barrier failed: rank 0's watchdog pass,
           its job-wide dump request and rank 1's teardown overlap;
  pending: once rank 0's job-wide dump request is in the store, which rank 1's monitor does not look at
           on its own (FRNCCL_COORD_CHECK_MS is long): rank 1 serves it while it shuts down;
  left:    at once; rank 0 calls its barrier only once rank 1's destroy_process_group() returned.
Each rank prints RESULT with how long its destroy_process_group() took.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import torch.distributed as dist

from _worker import RANK, Checks, finish, init

MODE = sys.argv[1]
FAILED_KEY = "test/rank0_barrier_failed"
LEFT_KEY = "test/rank1_left"

init("frnccl")
checks = Checks()
store = dist.distributed_c10d._get_default_store()
while isinstance(store, dist.PrefixStore):  # frnccl's keys are in the job's root store
    store = store.underlying_store
group = dist.new_group(backend="frnccl", timeout=timedelta(seconds=1))
dist.barrier()  # both ranks have the group before rank 0 uses it

if RANK == 0:
    if MODE == "left":
        store.wait([LEFT_KEY], timedelta(seconds=30))
    try:
        dist.barrier(group=group)
        checks.fail("barrier", "the barrier rank 1 never joined returned")
    except Exception as err:  # noqa: BLE001 - the training loop's own handling
        checks.notes["barrier_error"] = str(err).splitlines()[0][:200]
    store.set(FAILED_KEY, "1")
else:
    if MODE == "race":
        store.wait([FAILED_KEY], timedelta(seconds=30))
    elif MODE == "pending":
        deadline = time.monotonic() + 30
        while store.add("frnccl/incident_seq", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        checks.expect("request_seen", store.add("frnccl/incident_seq", 0) >= 1, "rank 0 never asked for a dump")

start = time.monotonic()
dist.destroy_process_group()
checks.notes["destroy_s"] = round(time.monotonic() - start, 3)
if RANK == 1 and MODE == "left":
    store.set(LEFT_KEY, "1")  # the store lives in rank 0, and outlives rank 1's groups
finish(checks, destroy=False)
