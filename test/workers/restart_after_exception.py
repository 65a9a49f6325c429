"""An in-process restart after a rank's own exception, as torchft and in-process restart wrappers do.

    restart_after_exception.py

Life 0: each rank runs all_reduces; at step RAISE_STEP rank 1 raises RuntimeError in its forward, while rank 0
waits for it in that step's all_reduce. Each rank catches what it meets (rank 1 its own error, rank 0 the
all_reduce that fails once rank 1's group is gone) and tears its group down inside the `except:`. Then both
begin life 1 on the same store (a PrefixStore per life, as torchft does on every quorum) and run all_reduces;
rank 0 asks the job for a dump (as `frnccl dump` does, through the store), at once: it must be an incident of
its own, not refused as life 0's in progress, and no rank's part may carry an exit note (the exception was
caught, and the process goes on). Prints RESULT (notes: what each rank caught, the life-1 incident, its
part's `exit` and reason) and DONE_MONO.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import fr_backend
from _worker import RANK, WORLD, Checks
from fr_backend import live_dump

RAISER = 1
RAISE_STEP = 3
STEPS = 5
WAIT_S = 60.0


def forward(life: int, step: int, x: torch.Tensor) -> torch.Tensor:
    if life == 0 and RANK == RAISER and step == RAISE_STEP:
        raise RuntimeError("simulated fault in forward")
    return x * 1.0


def life(base: dist.Store, n: int) -> None:
    dist.init_process_group("frnccl", store=dist.PrefixStore(f"life{n}", base), rank=RANK, world_size=WORLD,
                            timeout=timedelta(seconds=WAIT_S))
    for step in range(1, STEPS + 1):
        t = forward(n, step, torch.full((4,), float(RANK + 1)))
        dist.all_reduce(t)


def main() -> int:
    checks = Checks()
    base = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), WORLD, is_master=RANK == 0,
                         timeout=timedelta(seconds=WAIT_S), wait_for_workers=False)
    try:
        life(base, 0)
        checks.fail("life0", "no rank failed")
    except Exception as exc:  # noqa: BLE001 - what a restart wrapper catches
        checks.notes["caught"] = type(exc).__name__
        dist.destroy_process_group()
    life(base, 1)
    if RANK == 0:
        try:
            asked = live_dump.request_dump(f"127.0.0.1:{os.environ['MASTER_PORT']}", "life1", WORLD, WAIT_S)
            base.set("life1_incident", Path(asked.folder).name)
        except live_dump.LiveDumpError as exc:
            base.set("life1_incident", "")
            checks.fail("life1_dump", str(exc))
    incident = base.get("life1_incident").decode()  # waits for rank 0's answer
    files = sorted((Path(os.environ["FRNCCL_DUMP_DIR"]) / incident / "compact").glob(f"*rank_{RANK}*")) if incident else []
    header = fr_backend.load_dump(str(files[0])) if files else {}
    checks.notes.update(life1_exit=header.get("exit"), life1_reason=header.get("dump_reason"), life1_folder=incident)
    dist.destroy_process_group()
    # The host outlives the other process's last use of the store.
    base.add("done", 1)
    deadline = time.monotonic() + WAIT_S
    while RANK == 0 and int(base.add("done", 0)) < WORLD and time.monotonic() < deadline:
        time.sleep(0.05)
    checks.report()
    print(f"DONE_MONO {time.monotonic()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
