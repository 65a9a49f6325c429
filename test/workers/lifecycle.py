"""Teardown paths of an frnccl job. Usage: lifecycle.py destroy|abort|exit

destroy: destroy_process_group() is quick and stops the frnccl-* threads.
abort:   torch's _abort_process_group() returns promptly and stops them too.
exit:    leave with the groups alive (the interpreter's exit must not hang).
destroy and abort also free the tensors of the last ops, which the watchdog held.
Every mode prints RESULT, then `DONE_MONO <time.monotonic()>` as its last act.
"""

from __future__ import annotations

import gc
import glob
import pickle
import sys
import time
import weakref

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _abort_process_group

from _worker import RANK, Checks, init

MODE = sys.argv[1]
BOUND_S = 2.0


def frnccl_threads() -> list[str]:
    names = []
    for path in glob.glob("/proc/self/task/*/comm"):
        try:
            with open(path) as f:
                name = f.read().strip()
        except OSError:  # the thread ended while we looked
            continue
        if name.startswith("frnccl-"):
            names.append(name)
    return sorted(names)


init("frnccl")
checks = Checks()
sub = dist.new_group(backend="frnccl")
gloo = dist.new_group(backend="gloo")
for g in (dist.group.WORLD, sub):
    t, ref = torch.ones(8) * (RANK + 1), torch.ones(8) * (RANK + 1)
    dist.all_reduce(t, group=g)
    dist.all_reduce(ref, group=gloo)
    checks.expect("all_reduce", torch.equal(t, ref), f"{t} vs {ref}")
# torch's own recorder stays off inside frnccl's inner groups: nothing is recorded twice
# (and, its buffer size being process-wide, off for the plain gloo group created after them).
torch_fr = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
checks.expect("torch_fr_off", torch_fr.get("entries") == [], f"torch's recorder holds {len(torch_fr.get('entries', []))} entries")
# The last op, async and waited for: its Work, and so its tensor, is held by the watchdog until an
# op after it, or the teardown, lets go of it.
last = torch.ones(1024) * (RANK + 1)
work = dist.all_reduce(last, group=sub, async_op=True)
work.wait()
checks.expect("last_op", torch.equal(last, torch.full((1024,), 3.0)), f"{last[:4]}")
last_ref = weakref.ref(last)
del last, work
gc.collect()
checks.expect("last_tensor_held", last_ref() is not None, "nothing held the last op's tensor before teardown")
before = frnccl_threads()
checks.notes["threads_before"] = before
checks.expect("threads_running", {"frnccl-watchdog", "frnccl-monitor"} <= set(before), f"threads: {before}")

if MODE in ("destroy", "abort"):
    start = time.monotonic()
    if MODE == "destroy":
        dist.destroy_process_group()
    else:
        _abort_process_group()
    took = time.monotonic() - start
    checks.notes["teardown_s"] = round(took, 3)
    # Threads joined inside the call, or at least gone within the same bound.
    while frnccl_threads() and time.monotonic() - start < BOUND_S:
        time.sleep(0.01)
    gone_after = time.monotonic() - start
    after = frnccl_threads()
    checks.notes["threads_gone_after_s"] = round(gone_after, 3)
    checks.expect(f"{MODE}_fast", took < BOUND_S, f"{MODE} took {took:.2f}s")
    checks.expect("threads_stopped", after == [], f"still running {gone_after:.2f}s after {MODE}: {after}")
    gc.collect()
    checks.expect("last_tensor_freed", last_ref() is None, f"the last op's tensor is still alive after {MODE}")
    if MODE == "destroy":
        checks.expect("not_initialized", not dist.is_initialized(), "still initialized")
checks.report()
print(f"DONE_MONO {time.monotonic()}", flush=True)
