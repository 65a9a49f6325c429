"""Real torchft 0.2 (`bash scripts/install_stacks.sh`): its lighthouse (torchft_lighthouse) and two replica groups
of a train_ddp-shaped job (stacks/torchft_job.py, one CPU rank each), plain and with
fr_backend.integrations.torchft.enable(): the same losses, the replica group's ops recorded and answered by
`frnccl status`; a replica group killed mid-run lets the other finish with no incident; each quorum's group is a
new frnccl life, with open fds and threads flat across lives."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

from dist_harness import free_port

pytest.importorskip("torchft", reason="torchft is not installed (bash scripts/install_stacks.sh)")

HERE = Path(__file__).resolve().parent
LIGHTHOUSE = shutil.which("torchft_lighthouse", path=str(Path(sys.executable).parent)) or shutil.which(
    "torchft_lighthouse")
STEPS = 6
JOB_TIMEOUT_S = 60


def wait_until(cond: Callable[[], bool], limit_s: float, what: str, procs: list[subprocess.Popen] = ()) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit_s} s waiting for {what}")
        time.sleep(0.05)


@dataclass
class Run:
    """One torchft job: its lighthouse and two replica-group processes, each logging to a file in `out`."""

    out: Path
    mode: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    store_ports: list[int] = field(default_factory=list)

    def log(self, name: str) -> str:
        path = self.out / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def describe(self) -> str:
        return "\n".join(f"--- {n}:\n{self.log(n)[-4000:]}" for n in ("lighthouse", "replica_0", "replica_1"))

    def losses(self, replica: int) -> list[str]:
        path = self.out / f"losses_{replica}"
        return path.read_text().splitlines() if path.exists() else []

    def lives(self, replica: int) -> list[list[str]]:
        path = self.out / f"life_{replica}"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    def wait(self, index: int, limit_s: float) -> int:
        try:
            return self.procs[index].wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"process {index} still runs after {limit_s} s\n{self.describe()}") from None


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRNCCL_", "TORCHFT_", "MASTER_", "RANK",
                                                                    "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_"))}
    env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="1", FRNCCL_DUMP_DIR=str(tmp / "dumps"), PYTHONUNBUFFERED="1",
               OMP_NUM_THREADS="1", FRNCCL_DUMP_TIMEOUT_SEC="10", PYTHONPATH=str(HERE.parent))
    return env


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Run]]:
    runs: list[Run] = []

    def _start(mode: str, pause: dict[int, int] | None = None, fail_every: int = 0, steps: int = STEPS) -> Run:
        if LIGHTHOUSE is None:
            pytest.skip("torchft_lighthouse is not on PATH next to this Python")
        run = Run(tmp_path / f"{mode}_{len(runs)}", mode)
        run.out.mkdir(parents=True)
        runs.append(run)
        port = free_port()
        env = _env(run.out)
        # min_replicas 1: the replica left after the other is killed forms a quorum on its own (torchft's
        # promise); the first quorum has both (each job waits for the other's Manager, and the lighthouse for
        # heartbeating stragglers).
        cmd = [LIGHTHOUSE, "--min_replicas", "1", "--bind", f"127.0.0.1:{port}", "--join_timeout_ms", "20000",
               "--heartbeat_timeout_ms", "2000", "--quorum_tick_ms", "50"]
        run.procs.append(subprocess.Popen(cmd, env=env, stdout=open(run.out / "lighthouse.log", "wb"),
                                          stderr=subprocess.STDOUT, start_new_session=True))
        try:
            wait_until(lambda: _listening(port) or run.procs[0].poll() is not None, 20, "the lighthouse")
        except AssertionError:
            pytest.skip(f"torchft_lighthouse did not listen within 20 s:\n{run.log('lighthouse')[-2000:]}")
        if run.procs[0].poll() is not None:
            pytest.skip(f"torchft_lighthouse cannot run here:\n{run.log('lighthouse')[-2000:]}")
        for replica in range(2):
            store = free_port()
            run.store_ports.append(store)
            renv = dict(env, TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{port}", MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(store), REPLICA_GROUP_ID=str(replica))
            cmd = [sys.executable, str(HERE / "torchft_job.py"), str(replica), str(steps), str(run.out), mode,
                   str((pause or {}).get(replica, -1)), str(fail_every)]
            run.procs.append(subprocess.Popen(cmd, env=renv, stdout=open(run.out / f"replica_{replica}.log", "wb"),
                                              stderr=subprocess.STDOUT, start_new_session=True))
        return run

    yield _start
    for run in runs:
        for proc in run.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _finish(run: Run) -> None:
    for replica in range(2):
        assert run.wait(1 + replica, JOB_TIMEOUT_S) == 0, run.describe()


def _quorum_store(run: Run, replica: int, quorum: int) -> str:
    """HOST:PORT of the store torchft gave `quorum`'s group, from torchft's own log line."""
    found: list[str] = []

    def seen() -> bool:
        found[:] = re.findall(rf"quorum_id={quorum} store_prefixed_addr='([^/']+)/", run.log(f"replica_{replica}"))
        return bool(found)

    wait_until(seen, 30, f"torchft's store line for quorum {quorum}")
    return found[0]


@pytest.mark.timeout(2 * JOB_TIMEOUT_S + 30)
def test_losses_match_plain_and_ops_are_recorded(start: Callable[..., Run]) -> None:
    plain = start("plain")
    _finish(plain)
    want = [plain.losses(r) for r in range(2)]
    assert all(len(lines) == STEPS for lines in want), plain.describe()
    # Replica 1 waits in step 3 while replica 0 is in its allreduce: `frnccl status` on the quorum's store
    # answers for both replicas and shows the group.
    run = start("frnccl", pause={1: 3})
    wait_until(lambda: (run.out / "paused_1").exists() or run.procs[2].poll() is not None, JOB_TIMEOUT_S,
               "replica 1 to reach step 3")
    status = subprocess.run([sys.executable, "-m", "fr_backend.cli", "status", "--store", _quorum_store(run, 0, 1),
                             "--timeout", "5"], capture_output=True, text=True, timeout=30, env=_env(run.out))
    (run.out / "go").write_text("")
    _finish(run)
    assert [run.losses(r) for r in range(2)] == want, f"plain:\n{plain.describe()}\nfrnccl:\n{run.describe()}"
    assert status.returncode == 0 and "torchft_quorum_1_rank_0" in status.stdout, status.stdout + status.stderr
    for replica in range(2):
        assert {line[3] for line in run.lives(replica)} == {"torchft_quorum_1_rank_0"}, run.describe()


@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
@pytest.mark.parametrize("mode", ["plain", "frnccl"])
def test_killed_replica_group_lets_the_other_finish_with_no_incident(start: Callable[..., Run], mode: str) -> None:
    # Replica 1 stops in step 3 once its quorum is in, so that replica 0 is in that step's allreduce with it
    # when it is killed: replica 0's op fails, torchft drops the step and goes on in a quorum of its own.
    run = start(mode, pause={1: 3})
    wait_until(lambda: (run.out / "paused_1").exists() or run.procs[2].poll() is not None, JOB_TIMEOUT_S,
               "replica 1 to reach step 3")
    os.killpg(run.procs[2].pid, signal.SIGKILL)
    assert run.wait(1, JOB_TIMEOUT_S) == 0, run.describe()
    survivor = run.log("replica_0")
    assert run.losses(0)[-1].split()[0] == str(STEPS), run.describe()
    said = [line for line in survivor.splitlines() if line.startswith("frnccl")]
    assert not said, run.describe()
    dumps = run.out / "dumps"
    assert not dumps.exists() or not any(dumps.iterdir()), sorted(p.name for p in dumps.iterdir())


def _counts_by_quorum(run: Run, replica: int) -> dict[int, tuple[int, int]]:
    """quorum id -> (open fds, threads) after that quorum's last attempt, not counting the store server's ends
    of connections to this replica's store: those are the clients' (every member's, the other replica's
    included, while this replica hosts the quorum's store; none while the other one does), so they change with
    which replica hosts a quorum and how many members it has, not with what this process holds."""
    return {int(line[0]): (int(line[1]) - int(line[4]), int(line[2])) for line in run.lives(replica)}


@pytest.mark.timeout(2 * JOB_TIMEOUT_S + 30)
def test_each_quorum_is_a_new_life_with_flat_fds_and_threads(start: Callable[..., Run]) -> None:
    # Replica 0 fails every other attempt of a step: each next quorum is a new one, whose group torchft builds
    # after aborting the last (a new frnccl life). torchft's own fds and threads vary with what each quorum
    # does (recovery, its clients), so frnccl's share is the difference from a plain run of the same quorums.
    # A life's own store connections (the monitor's clone, the wake waiter's) must go with it: a leak of one
    # fd a life shows here as a share that grows.
    plain = start("plain", fail_every=2)
    _finish(plain)
    run = start("frnccl", fail_every=2)
    _finish(run)
    for replica in range(2):
        lives = run.lives(replica)
        assert len({line[0] for line in lives}) >= 3, run.describe()
        # The recorder holds only the current life's group: each quorum started a new life.
        assert all(line[3] == f"torchft_quorum_{line[0]}_rank_0" for line in lives), lives
        mine, theirs = _counts_by_quorum(run, replica), _counts_by_quorum(plain, replica)
        assert sorted(mine) == sorted(theirs), (mine, theirs)
        # From the second life on (the first also sets up what a process sets up once): a constant share.
        extra = [(mine[q][0] - theirs[q][0], mine[q][1] - theirs[q][1]) for q in sorted(mine)][1:]
        assert len(set(extra)) == 1, f"replica {replica}: frnccl's (fds, threads) per quorum {extra}"
