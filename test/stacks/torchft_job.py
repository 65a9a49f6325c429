"""One replica group (one rank) of a torchft job shaped as torchft's train_ddp example: Manager, torchft's
DistributedDataParallel and Optimizer, its ProcessGroupGloo, PGTransport for recovery, on CPU with a small model
and fixed seeds. Run by test_torchft.py, one process per replica group, against a real torchft_lighthouse.

argv: replica_id steps out_dir mode(plain|frnccl) pause_at fail_every
  pause_at: after committing that step, wait until out_dir/go exists (the test acts meanwhile); -1: never.
  fail_every: replica 0 reports an error every that many steps, so the step is not committed and the next
  quorum is a new one (torchft bumps the quorum id on commit failures); 0: never.
Writes out_dir/losses_<replica> (one line per committed step: step, loss) and out_dir/life_<replica> (one line
per step: quorum id, open fds, threads, frnccl groups in the recorder).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn

replica, steps, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
mode, pause_at, fail_every = sys.argv[4], int(sys.argv[5]), int(sys.argv[6])

if mode == "frnccl":
    import fr_backend.integrations.torchft as frnccl_torchft

    assert frnccl_torchft.enable()

from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo  # noqa: E402
from torchft.checkpointing.pg_transport import PGTransport  # noqa: E402

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer_inner = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(1000 + replica)


def load_state_dict(state: dict) -> None:
    model.load_state_dict(state["model"])
    optimizer_inner.load_state_dict(state["optim"])


def state_dict() -> dict:
    return {"model": model.state_dict(), "optim": optimizer_inner.state_dict()}


# The replica group's own store, which torchrun would host for it; the quorum's groups use the primary's.
store = torch.distributed.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), is_master=True,
                                   wait_for_workers=False)
pg = ProcessGroupGloo(timeout=timedelta(seconds=5))
manager = Manager(
    pg=pg, min_replica_size=1, load_state_dict=load_state_dict, state_dict=state_dict,
    replica_id=f"train_ddp_{replica}", timeout=timedelta(seconds=10), quorum_timeout=timedelta(seconds=30),
    checkpoint_transport=PGTransport(pg, timeout=timedelta(seconds=10), device=torch.device("cpu")),
    rank=0, world_size=1, store_addr="127.0.0.1", store_port=int(os.environ["MASTER_PORT"]),
)
ddp = DistributedDataParallel(manager, model)
optimizer = Optimizer(manager, optimizer_inner)
(out / f"ready_{replica}").write_text("")


def wait_for(path: Path, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"torchft_job: {path} did not appear in {limit_s} s")
        time.sleep(0.02)


def frnccl_groups() -> str:
    if mode != "frnccl":
        return "-"
    import fr_backend

    entries = fr_backend.trace_entries(symbolize=False).get("entries", [])
    return ",".join(sorted({str(e.get("process_group", ["?"])[0]) for e in entries})) or "-"


# Every replica waits for the other's Manager: the first quorum then has both (the lighthouse waits for
# heartbeating stragglers), as a plain run's must for its losses to compare.
for other in range(2):
    wait_for(out / f"ready_{other}", 60)
with open(out / f"losses_{replica}", "w") as losses, open(out / f"life_{replica}", "w") as life:
    while manager.current_step() < steps:
        x = torch.randn(8, 16, generator=data)
        y = torch.randint(0, 4, (8,), generator=data)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        if replica == 0 and fail_every and (manager.current_step() + 1) % fail_every == 0:
            manager.report_error(RuntimeError("torchft_job: a failed step, for a new quorum"))
        before = manager.current_step()
        optimizer.step()
        committed = manager.current_step() > before  # should_commit counts a committed step
        fds = len(os.listdir("/proc/self/fd"))
        threads = len(os.listdir("/proc/self/task"))
        life.write(f"{manager._quorum_id} {fds} {threads} {frnccl_groups()}\n")
        life.flush()
        if committed:
            losses.write(f"{manager.current_step()} {loss.item():.8f}\n")
            losses.flush()
            if manager.current_step() == pause_at:
                (out / f"paused_{replica}").write_text("")
                wait_for(out / "go", 60)
print(f"torchft_job: replica {replica} finished at step {manager.current_step()}", flush=True)
manager.shutdown(wait=False)
