"""fork() after frnccl started. Usage: fork_after_init.py

Each rank runs an all_reduce through frnccl, then forks. The child asks for a dump, which must fail at once with
one line saying why (frnccl's threads stayed in the parent), then runs the interpreter's exit handlers, frnccl's
among them, which must not wait for those threads, and ends. The parent reports how long each step took, then
goes on: an all_reduce and a dump of its own still work.
"""

from __future__ import annotations

import atexit
import json
import os
import time

import torch
import torch.distributed as dist

import fr_backend
from _worker import WORLD, Checks, finish, init

init("frnccl")
checks = Checks()
t = torch.ones(4)
dist.all_reduce(t)

read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read_end)
    start = time.monotonic()
    try:
        fr_backend.dump("asked in a forked child")
        error = ""
    except Exception as err:  # noqa: BLE001 - reported to the parent
        error = f"{type(err).__name__}: {err}"
    report = {"dump_s": time.monotonic() - start, "error": error, "exit_from": time.monotonic()}
    os.write(write_end, json.dumps(report).encode())
    os.close(write_end)
    # The exit handlers are what a normal exit runs; the interpreter's own finalization in a child forked from a
    # process with threads (torch's Gloo workers) is no part of this test.
    atexit._run_exitfuncs()
    os._exit(0)

os.close(write_end)
raw = b""
while chunk := os.read(read_end, 65536):
    raw += chunk
os.close(read_end)
_, status = os.waitpid(pid, 0)
exited = time.monotonic()
child = json.loads(raw)
checks.notes["child"] = child
checks.expect("child_exit_status", os.waitstatus_to_exitcode(status) == 0, f"status {status}")
checks.expect("child_dump_refused_at_once", child["dump_s"] < 2.0, f"the dump took {child['dump_s']:.1f} s")
checks.expect("child_dump_says_why", child["error"].startswith("RuntimeError: frnccl: this process")
              and "forked" in child["error"] and "\n" not in child["error"].strip(), child["error"])
exit_s = exited - child["exit_from"]
checks.expect("child_exit_fast", exit_s < 2.0, f"the child's exit handlers took {exit_s:.1f} s")
t = torch.ones(4)
dist.all_reduce(t)
checks.expect("parent_all_reduce", bool((t == WORLD).all()), str(t.tolist()))
try:
    checks.expect("parent_dump", os.path.isdir(fr_backend.dump("parent after fork")), "no folder")
except Exception as err:  # noqa: BLE001
    checks.fail("parent_dump", str(err))
finish(checks)
