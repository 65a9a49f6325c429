"""The inner groups' timeouts, at creation and after the group's timeout is changed (one rank per GPU).

frnccl watches the group's timeout itself and writes the job-wide dump before it aborts; the inner NCCL
group gets a backstop past both (timeout + FRNCCL_DUMP_TIMEOUT_SEC + 30 s) so that NCCL's own watchdog
never ends the process first. Gloo gets the group's timeout as it is.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from _worker import Checks, finish

LOCAL = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(LOCAL)
DUMP = timedelta(seconds=int(os.environ["FRNCCL_DUMP_TIMEOUT_SEC"]))
BACKSTOP = timedelta(seconds=30)

dist.init_process_group("frnccl", timeout=timedelta(seconds=40), device_id=torch.device("cuda", LOCAL))
checks = Checks()
frnccl = dist.group.WORLD._get_backend(torch.device("cuda"))


def inner_timeouts() -> tuple[timedelta, timedelta]:
    return frnccl.cpu_backend.options._timeout, frnccl.cuda_backend.options._timeout


gloo, nccl = inner_timeouts()
checks.expect("created", gloo == timedelta(seconds=40) and nccl == timedelta(seconds=40) + DUMP + BACKSTOP,
              f"gloo {gloo}, nccl {nccl}")
frnccl._set_default_timeout(timedelta(seconds=7))
gloo, nccl = inner_timeouts()
checks.expect("changed", gloo == timedelta(seconds=7) and nccl == timedelta(seconds=7) + DUMP + BACKSTOP,
              f"gloo {gloo}, nccl {nccl}")
t = torch.ones(4, device="cuda")
dist.all_reduce(t)
checks.expect("all_reduce", bool((t == dist.get_world_size()).all()), str(t.tolist()))
finish(checks)
