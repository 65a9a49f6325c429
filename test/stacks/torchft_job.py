"""One replica group (one rank) of a torchft job shaped as torchft's train_ddp example: Manager, torchft's
Optimizer, its ProcessGroupGloo, PGTransport for recovery, on CPU with a small model and fixed seeds; each
gradient is averaged with manager.allreduce and waited for before the step, as torchft's DDP comm hook does.
Not torchft 0.2's DistributedDataParallel: its comm hook fails an assertion (`assert fut._fut`, ddp.py) when
an allreduce fails, so a replica whose peer is killed mid-step dies with or without frnccl; nor its
PureDistributedDataParallel, whose step does not wait for the allreduces (its losses depend on timing). Run by test_torchft.py, one process per replica group, against a real torchft_lighthouse.

argv: replica_id steps out_dir mode(plain|frnccl) pause_at fail_every
  pause_at: in that step, once its quorum is in, before its first op, write out_dir/paused_<replica> and wait
  until out_dir/go exists (the test acts meanwhile: the other replica is then in that step's allreduce); -1: never.
  fail_every: replica 0 reports an error in every that many attempts of a step, so that the step is not
  committed and the next quorum is a new one (torchft bumps the quorum id on commit failures); 0: never.
Writes out_dir/losses_<replica> (one line per committed step: step, loss) and out_dir/life_<replica> (one line
per attempt: quorum id, open fds, threads, the groups of frnccl's recorder, and how many of those fds are the
server's ends of connections to this replica's own store).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import logging

import torch
from torch import nn

logging.basicConfig(level=logging.INFO)  # as train_ddp: torchft's lines say which store each quorum uses

replica, steps, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
mode, pause_at, fail_every = sys.argv[4], int(sys.argv[5]), int(sys.argv[6])

if mode == "frnccl":
    import fr_backend.integrations.torchft as frnccl_torchft

    assert frnccl_torchft.enable()

from torchft import Manager, Optimizer, ProcessGroupGloo  # noqa: E402
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
pg = ProcessGroupGloo(timeout=timedelta(seconds=20))  # outlasts a `frnccl status` while a peer pauses
manager = Manager(
    pg=pg, min_replica_size=1, load_state_dict=load_state_dict, state_dict=state_dict,
    replica_id=f"train_ddp_{replica}", timeout=timedelta(seconds=30), quorum_timeout=timedelta(seconds=30),
    checkpoint_transport=PGTransport(pg, timeout=timedelta(seconds=10), device=torch.device("cpu")),
    rank=0, world_size=1, store_addr="127.0.0.1", store_port=int(os.environ["MASTER_PORT"]),
)
optimizer = Optimizer(manager, optimizer_inner)
(out / f"ready_{replica}").write_text("")


def wait_for(path: Path, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"torchft_job: {path} did not appear in {limit_s} s")
        time.sleep(0.02)


def served_fds(port: int) -> int:
    """Open fds that are this process's store server's ends of connections to it. They follow who connects,
    not what this process holds: while this replica hosts the quorum's store, every member's clients (the
    other replica's too) have an end here, and while the other replica hosts it, none."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            # cols: sl local_address rem_address st ... inode; 01 is ESTABLISHED (the listener is 0A, kept).
            if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "01":
                inodes.add(cols[9])
    served = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listdir's own fd)
            continue
        served += link.startswith("socket:[") and link[8:-1] in inodes
    return served


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
    attempt = 0
    while manager.current_step() < steps:
        attempt += 1
        x = torch.randn(8, 16, generator=data)
        y = torch.randint(0, 4, (8,), generator=data)
        optimizer.zero_grad()  # asks for the step's quorum
        if manager.current_step() == pause_at:
            manager.wait_quorum()
            (out / f"paused_{replica}").write_text("")
            wait_for(out / "go", 60)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        for work in [manager.allreduce(p.grad) for p in model.parameters()]:
            work.wait()  # a failed one is reported to the manager, which then drops the step
        if replica == 0 and fail_every and attempt % fail_every == 0:
            manager.report_error(RuntimeError("torchft_job: a failed step, for a new quorum"))
        before = manager.current_step()
        optimizer.step()
        committed = manager.current_step() > before  # should_commit counts a committed step
        fds = len(os.listdir("/proc/self/fd"))
        threads = len(os.listdir("/proc/self/task"))
        served = served_fds(int(os.environ["MASTER_PORT"]))
        life.write(f"{manager._quorum_id} {fds} {threads} {frnccl_groups()} {served}\n")
        life.flush()
        if committed:
            losses.write(f"{manager.current_step()} {loss.item():.8f}\n")
            losses.flush()
print(f"torchft_job: replica {replica} finished at step {manager.current_step()}", flush=True)
manager.shutdown(wait=True)
# torchft 0.2 may abort at interpreter exit ("terminate called without an active exception"), plain runs too.
sys.stderr.flush()
os._exit(0)
