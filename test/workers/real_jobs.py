"""Training-shaped jobs of 4 ranks, launched by torchrun (test/test_real_jobs.py), each with one fault or none.

    real_jobs.py SHAPE

SHAPE
  kill      data parallel: a small model under DDP, plus an all_reduce of the loss each step. At step
            KILL_STEP rank KILLED is SIGKILLed before its forward; torchrun then stops the others with SIGTERM.
  skip      a 2x2 mesh: TP groups {0,1} {2,3}, DP groups {0,2} {1,3}. Each step: a TP all_reduce (activations),
            a DP all_reduce (gradients), a world all_reduce (the loss). At step FAULT_STEP rank SKIPPER skips its
            TP all_reduce (a data-dependent branch) and goes on.
  pipeline  pipeline pairs 0->1 and 2->3. Each step a sender isends its activations and goes on to the world
            all_reduce; a receiver recvs them, then joins it. At step FAULT_STEP receiver HANGER hangs in compute
            before its recv.
  healthy   the skip job's mesh steps, then the pipeline job's steps, with no fault; every rank dumps at
            teardown (the test sets FRNCCL_DUMP_ON_TEARDOWN=1).
  multi     pairs A {0,1} and B {2,3}. Each step: compute, the pair's all_reduce, a world all_reduce. At step
            FAULT_STEP two independent faults: rank MULTI_HANG hangs in compute, rank MULTI_SKIP skips its B
            all_reduce and goes on to the world all_reduce.
  slow_pair, slow_world, slow_two
            the multi job's steps with no fault, SLOW_STEPS of them: rank SLOW sleeps SLOW_S more than the others
            each step before its pair's all_reduce (slow_pair) or before the world all_reduce (slow_world); in
            slow_two ranks SLOW and SLOW_TOO both do before the world all_reduce. With REAL_JOB_ARG=signal in
            the env, rank 0 sends itself SIGUSR1 (a job-wide dump on request) after step SIGNAL_STEP, and
            before the job's end waits until that incident holds a dump of every rank.

The culprits are named here and read by the test: KILLED, SKIPPER, HANGER. Every rank prints `STEP <rank> <n>`
after each step and `DONE <rank>` at a clean end.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

KILLED = 3
KILL_STEP = 7
SKIPPER = 2
HANGER = 1
FAULT_STEP = 4
STEPS = 10
MULTI_HANG = 1
MULTI_SKIP = 3
SLOW = 2
SLOW_TOO = 3
SLOW_S = 0.2
SLOW_STEPS = 24
SIGNAL_STEP = 16
DUMPS_BOUND_S = 30  # the signalled incident's files, on 2 loaded cores
COMPUTE_S = 0.01  # each step's stand-in for the forward and backward


def say(line: str) -> None:
    sys.stdout.write(line + "\n")  # one write: the ranks share torchrun's stdout
    sys.stdout.flush()


def compute(step: int, hang: bool = False) -> torch.Tensor:
    """The step's compute; a hung rank stays here."""
    if hang:
        time.sleep(3600)
    time.sleep(COMPUTE_S)
    return torch.full((64,), float(step))


def kill_job(rank: int) -> None:
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, STEPS + 1):
        if rank == KILLED and step == KILL_STEP:
            say(f"KILLING {rank} at step {step}")
            os.kill(os.getpid(), 9)
        loss = model(torch.randn(16, 32)).square().mean()
        opt.zero_grad()
        loss.backward()  # DDP's gradient all_reduce
        opt.step()
        dist.all_reduce(loss.detach().clone())  # the loss, for logging
        say(f"STEP {rank} {step}")
        time.sleep(COMPUTE_S)


def mesh_groups(rank: int) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """TP {0,1} {2,3} and DP {0,2} {1,3}: every rank creates every group, in the same order."""
    tps = [dist.new_group([0, 1], group_desc="mesh_tp0"), dist.new_group([2, 3], group_desc="mesh_tp1")]
    dps = [dist.new_group([0, 2], group_desc="mesh_dp0"), dist.new_group([1, 3], group_desc="mesh_dp1")]
    return tps[rank // 2], dps[rank % 2]


def mesh_steps(rank: int, first: int, steps: int, skip_at: int | None) -> None:
    tp, dp = mesh_groups(rank)
    for step in range(first, first + steps):
        act = compute(step)
        if not (rank == SKIPPER and step == skip_at):
            dist.all_reduce(act, group=tp)  # tensor-parallel activations
        dist.all_reduce(act * 2, group=dp)  # data-parallel gradients
        dist.all_reduce(torch.ones(1))  # the loss, world-wide
        say(f"STEP {rank} {step}")


def pipeline_steps(rank: int, first: int, steps: int, hang_at: int | None) -> None:
    sender = rank % 2 == 0
    peer = rank + 1 if sender else rank - 1
    for step in range(first, first + steps):
        if sender:
            work = dist.isend(compute(step), dst=peer)  # the next stage's input, sent asynchronously
            dist.all_reduce(torch.ones(1))  # the loss, world-wide
            work.wait()
        else:
            buf = torch.empty(64)
            compute(step, hang=rank == HANGER and step == hang_at)
            dist.recv(buf, src=peer)
            dist.all_reduce(torch.ones(1))
        say(f"STEP {rank} {step}")


def pair_steps(rank: int, steps: int, hang: int | None = None, skip: int | None = None, slow: tuple[int, ...] = (),
               slow_where: str = "", signal_at: int | None = None) -> None:
    """Pairs A {0,1} and B {2,3}: compute, the pair's all_reduce, the world all_reduce."""
    pairs = [dist.new_group([0, 1], group_desc="pair_a"), dist.new_group([2, 3], group_desc="pair_b")]
    pair = pairs[rank // 2]
    for step in range(1, steps + 1):
        act = compute(step, hang=rank == hang and step == FAULT_STEP)
        if rank in slow and slow_where == "pair":
            time.sleep(SLOW_S)
        if not (rank == skip and step == FAULT_STEP):
            dist.all_reduce(act, group=pair)
        if rank in slow and slow_where == "world":
            time.sleep(SLOW_S)
        dist.all_reduce(torch.ones(1))
        say(f"STEP {rank} {step}")
        if rank == 0 and step == signal_at:
            os.kill(os.getpid(), signal.SIGUSR1)
            say(f"SIGNALLED {rank} at step {step}")


def wait_for_signal_dumps(world: int) -> None:
    """Until the signalled incident holds every rank's dump: the job's end must not race its writing."""
    root = Path(os.environ["FRNCCL_DUMP_DIR"])
    deadline = time.monotonic() + DUMPS_BOUND_S
    while time.monotonic() < deadline:
        for inc in root.glob("*signal*"):
            if len(list(inc.glob("compact/frnccl_rank_*"))) >= world:
                say(f"DUMPS {inc.name}")
                return
        time.sleep(0.05)
    say("DUMPS missing")


def main() -> int:
    shape = sys.argv[1]
    timeout_s = float(os.environ.get("REAL_JOB_PG_TIMEOUT", "3"))
    dist.init_process_group(backend="frnccl", timeout=timedelta(seconds=timeout_s))
    rank = dist.get_rank()
    assert dist.get_world_size() == 4, "these jobs are written for 4 ranks"
    if shape == "kill":
        kill_job(rank)
    elif shape == "skip":
        mesh_steps(rank, 1, STEPS, skip_at=FAULT_STEP)
    elif shape == "pipeline":
        pipeline_steps(rank, 1, STEPS, hang_at=FAULT_STEP)
    elif shape == "multi":
        pair_steps(rank, STEPS, hang=MULTI_HANG, skip=MULTI_SKIP)
    elif shape in ("slow_pair", "slow_world", "slow_two"):
        signal_at = SIGNAL_STEP if os.environ.get("REAL_JOB_ARG") == "signal" else None
        pair_steps(rank, SLOW_STEPS, slow=(SLOW, SLOW_TOO) if shape == "slow_two" else (SLOW,),
                   slow_where="pair" if shape == "slow_pair" else "world", signal_at=signal_at)
        if signal_at is not None and rank == 0:
            wait_for_signal_dumps(dist.get_world_size())
    elif shape == "healthy":
        mesh_steps(rank, 1, STEPS, skip_at=None)
        pipeline_steps(rank, STEPS + 1, STEPS, hang_at=None)
    else:
        raise SystemExit(f"unknown shape {shape!r}")
    dist.barrier()
    dist.destroy_process_group()
    say(f"DONE {rank}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
