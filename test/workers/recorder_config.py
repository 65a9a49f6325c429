"""Bad FRNCCL_* values stop init_process_group with a one-line error naming the variable.

One process, world size 1, a fresh in-memory store per attempt: the
configuration is read when the first frnccl group is created, and a refused
value leaves nothing configured, so each case can be tried in turn. Finally a
good configuration must still work in the same process.
Case list: argv pairs NAME=VALUE (the test passes them).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore", category=FutureWarning)

cases = [arg.split("=", 1) for arg in sys.argv[1:]]
out: dict[str, dict] = {}
for name, value in cases:
    os.environ[name] = value
    try:
        dist.init_process_group("frnccl", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=20))
        out[f"{name}={value}"] = {"raised": False}
        dist.destroy_process_group()
    except Exception as err:  # noqa: BLE001 - the type is reported and checked by the test
        out[f"{name}={value}"] = {"raised": True, "type": type(err).__name__, "message": str(err)}
        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        del os.environ[name]

# The same process with a clean environment: frnccl works.
dist.init_process_group("frnccl", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=20))
t = torch.ones(3)
dist.all_reduce(t)
good = bool(torch.equal(t, torch.ones(3))) and dist.get_backend() == "frnccl"
dist.destroy_process_group()
print("RESULT " + json.dumps({"rank": 0, "cases": out, "good_after": good}), flush=True)
