"""Shared by the real-workload workers: a job started under one backend, results as digests, and the
check that frnccl let a healthy job run past its group timeout.

A workload runs unchanged under frnccl or gloo (argv[2]). The ranks meet on a TCPStore of their own with
a long timeout, so a rank that starts late on a busy machine is not taken for a hang; the process group
itself gets a short one (TIMEOUT_S), and so does every group the workload makes.

`past_timeout()` is what a false timeout trips: it waits until every op issued so far is older than the
group timeout, then asks frnccl for a dump, which waits for a watchdog pass that starts after that
moment. A timeout that pass finds is reported (its incident folder written) before the dump returns,
so every incident folder other than the dump's own, and every entry the dump does not show completed,
is a false alarm. Then one more collective shows the group still works.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore", category=FutureWarning)

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
BACKEND = sys.argv[2] if len(sys.argv) > 2 else "frnccl"
TIMEOUT_S = float(os.environ.get("WORKLOAD_TIMEOUT_S", "3"))
TIMEOUT = timedelta(seconds=TIMEOUT_S)
# Beyond the deadline: the watchdog compares with its own clock, read after the deadline.
MARGIN_S = 0.5
REASON = "past_timeout"  # the reason of the dump past_timeout() asks for, in its folder's name and log line


def start() -> None:
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), WORLD, RANK == 0,
                          timeout=timedelta(seconds=120), wait_for_workers=True)
    dist.init_process_group(BACKEND, store=store, rank=RANK, world_size=WORLD, timeout=TIMEOUT)


def digest(*values: Any) -> str:
    """sha256 of the exact bytes of every tensor (and the repr of anything else), in order."""
    h = hashlib.sha256()
    for v in values:
        if isinstance(v, torch.Tensor):
            t = v.detach().contiguous().cpu()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(bytes(t.reshape(-1).view(torch.uint8).tolist()))
        else:
            h.update(repr(v).encode())
    return h.hexdigest()


def past_timeout(groups: dict[str, Any]) -> dict[str, Any]:
    """Under frnccl: idles past the group timeout and reports what frnccl made of it (see the module doc);
    then one all_reduce on each group."""
    out: dict[str, Any] = {}
    if BACKEND == "frnccl":
        import fr_backend

        deadline = time.monotonic() + TIMEOUT_S + MARGIN_S
        while time.monotonic() < deadline:  # the condition is the clock itself: nothing to wait on instead
            time.sleep(0.05)
        folder = Path(fr_backend.dump(REASON))
        entries = fr_backend.load_dump(str(folder / "compact" / f"frnccl_rank_{RANK}.json.gz"))["entries"]
        # Each rank's own dump goes to a folder of its own (a manual dump is not job-wide).
        out["other_incidents"] = sorted(p.name for p in folder.parent.iterdir() if p.is_dir() and REASON not in p.name)
        out["not_completed"] = sorted({f"{e['profiling_name']} ({e['state']})" for e in entries
                                       if e["state"] != "completed"})
        out["entries"] = len(entries)
    out["all_reduce_after"] = {}
    for name, group in groups.items():
        t = torch.ones(1)
        dist.all_reduce(t, group=group)
        out["all_reduce_after"][name] = t.item() == dist.get_world_size(group)
    return out


def finish(result: dict[str, Any]) -> None:
    result.update(rank=RANK, world=WORLD, backend=BACKEND)
    print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    print(f"DONE_MONO {time.monotonic()}", flush=True)
