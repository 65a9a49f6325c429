"""torchtitan's set_pg_timeouts on a 2x2 DeviceMesh: after a first step, `_set_pg_timeout(T)` on the dp and tp
groups and the default group (or `dist.set_timeout`, where torch has it); then rank 1 stalls before a tp
all_reduce, and its tp peer, rank 0, must fail after T, not after the groups' creation timeout.

    stack_pg_timeout.py BACKEND SETTER T_S STATE_DIR
BACKEND: gloo or frnccl (FRNCCL_ENABLE=1 in the environment turns gloo into frnccl). SETTER: _set_pg_timeout or
set_timeout. Rank 1 stalls until rank 0 wrote STATE_DIR/rank0_done (or 60 s); every rank then leaves without tearing down.
Prints `OUT <rank> key=value` lines and the warnings torch gave.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from _script_io import done, out
from torch.distributed.device_mesh import init_device_mesh

backend, setter, timeout_s, state = sys.argv[1], sys.argv[2], float(sys.argv[3]), Path(sys.argv[4])
STALL_MAX_S = 60.0

dist.init_process_group(backend, timeout=timedelta(seconds=120))
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
rank = dist.get_rank()
tp, dp = mesh["tp"].get_group(), mesh["dp"].get_group()
for group in (dp, tp):  # the first step
    dist.all_reduce(torch.ones(2), group=group)
set_one = getattr(dist, "set_timeout", None) if setter == "set_timeout" else dist.distributed_c10d._set_pg_timeout
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for group in (dp, tp, None):
        set_one(timedelta(seconds=timeout_s), group)
out("timeout_warnings", len([w for w in caught if "timeout" in str(w.message).lower()
                             and not issubclass(w.category, FutureWarning)]))


def wait_for_rank0() -> bool:
    end = time.monotonic() + STALL_MAX_S
    while not (state / "rank0_done").exists() and time.monotonic() < end:
        time.sleep(0.05)
    return (state / "rank0_done").exists()


if rank == 1:
    out("stalled_until_rank0_done", wait_for_rank0())
    done()
    os._exit(0)  # the stalled rank never joins: tearing down would wait on its peers
start = time.monotonic()
try:
    dist.all_reduce(torch.ones(2), group=tp)
    out("tp_all_reduce", "completed")
except Exception as err:
    out("tp_all_reduce", f"raised {type(err).__name__}")
out("tp_wait_s", f"{time.monotonic() - start:.2f}")
if rank == 0:
    (state / "rank0_done").write_text("1")
else:
    wait_for_rank0()  # alive, as in a job, while rank 0 waits (and frnccl's job-wide dump asks every rank)
done()
os._exit(0)
