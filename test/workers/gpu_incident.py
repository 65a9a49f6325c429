"""GPU incident scenarios, run by test/gpu/test_gpu_incidents.py (2 ranks, one GPU each).

SCENARIO=skip:      rank 1 never joins an all_reduce (sleeps in a named function).
SCENARIO=cuda_sync: rank 1 is stuck in torch.cuda.synchronize() behind a long kernel.
SCENARIO=timing:    a healthy run with FRNCCL_GPU_TIMING=all, the GPU clock mapped anew every 200 ms;
                    rank 0 prints how often (CLOCK_SYNCS n) and dumps at the end.
SCENARIO=no_destroy: a healthy run that exits without destroy_process_group.
SCENARIO=clock_behind_busy_gpu: one rank, FRNCCL_GPU_TIMING=all and CUDA_DEVICE_MAX_CONNECTIONS=1: an
                    all_reduce, then ~2 s of GPU work and a second stream waiting for it, while the
                    watchdog maps the all_reduce's GPU times and renews its reference; prints the
                    all_reduce's state 0.5 s in
                    (AFTER_BUSY_START <state> <time_gpu_started_ns>).
SCENARIO=burst:     BURST_OPS synchronous all_reduces back to back, a pause, then rank 0 dumps; each rank
                    prints how many end events it recorded and how many ops it left to torch's NCCL
                    watchdog (END_EVENTS <rank> <own> <catch_up> <by_torch_watchdog>). BURST_P2P=1 puts a
                    send/recv pair in the middle of the burst.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


# The culprit stays stuck well past the group timeout and the dump, then
# leaves without joining (the others' communicators are aborted by then).
STUCK_SEC = float(os.environ.get("GROUP_TIMEOUT_SEC", "8")) + 20


def stuck_in_data_loader() -> None:
    time.sleep(STUCK_SEC)


def stuck_in_cuda_sync() -> None:
    torch.cuda._sleep(int(STUCK_SEC * 2e9))  # GPU cycles at ~2 GHz
    torch.cuda.synchronize()


def main() -> int:
    scenario = os.environ["SCENARIO"]
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    timeout = timedelta(seconds=float(os.environ.get("GROUP_TIMEOUT_SEC", "8")))
    dist.init_process_group("frnccl", timeout=timeout, device_id=torch.device("cuda", local_rank))
    rank = dist.get_rank()
    x = torch.ones(1 << 16, device="cuda")
    for _ in range(5):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    if scenario == "skip" and rank == 1:
        stuck_in_data_loader()
        os._exit(0)
    if scenario == "cuda_sync" and rank == 1:
        stuck_in_cuda_sync()
        os._exit(0)
    if scenario in ("skip", "cuda_sync"):
        dist.all_reduce(x)
        try:
            torch.cuda.synchronize()  # released by frnccl's abort after the dump
            print(f"rank {rank} released", flush=True)
        except Exception as err:
            print(f"rank {rank} released, synchronize raised {type(err).__name__}: {str(err).splitlines()[0]}", flush=True)
        # The synchronous op had no waiting call that could fail; the next call into the group does.
        try:
            dist.all_reduce(x)
            print(f"OUTCOME {rank} next call returned", flush=True)
        except Exception as err:
            print(f"OUTCOME {rank} next call raised {type(err).__name__}: {str(err).splitlines()[0]}", flush=True)
        return 0
    if scenario == "timing":
        import fr_backend
        from fr_backend._native import native

        # Bursts of ops with the GPU clock mapped onto the wall clock anew between them.
        native()._set_clock_sync_interval_ms(200)
        for _ in range(4):
            for _ in range(10):
                dist.all_reduce(x)
            torch.cuda.synchronize()
            time.sleep(0.3)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        torch.cuda.synchronize()
        time.sleep(0.5)
        if rank == 0:
            print("CLOCK_SYNCS", native()._clock_syncs(), flush=True)
            print("DUMPED", fr_backend.dump("manual"), flush=True)
        dist.barrier()
        dist.destroy_process_group()
        return 0
    if scenario == "clock_behind_busy_gpu":
        import fr_backend
        from fr_backend._native import native

        native()._set_clock_sync_interval_ms(50)
        time.sleep(0.3)  # mapping the next op's times renews the reference
        dist.all_reduce(x)
        torch.cuda._sleep(int(4e9))  # ~2 s, as a kernel that hangs
        behind = torch.cuda.Event()
        behind.record()
        # Another stream waits for it: with one hardware queue, so does everything queued after the wait.
        torch.cuda.Stream().wait_event(behind)
        time.sleep(0.5)
        ops = [e for e in fr_backend.trace_entries(symbolize=False)["entries"] if e["profiling_name"] == "nccl:all_reduce"]
        print("AFTER_BUSY_START", ops[-1]["state"], ops[-1]["time_gpu_started_ns"], flush=True)
        torch.cuda.synchronize()
        dist.destroy_process_group()
        return 0
    if scenario == "burst":
        from fr_backend._native import native

        small = torch.ones(2, device="cuda")
        ops = int(os.environ["BURST_OPS"])
        torch.cuda.synchronize()
        before = native()._end_event_counts()
        for i in range(ops):
            if i == ops // 2 and os.environ.get("BURST_P2P") == "1":
                (dist.send if rank == 0 else dist.recv)(small, 1 - rank)
            dist.all_reduce(small)
        torch.cuda.synchronize()
        time.sleep(0.5)  # the watchdog settles the burst's tail
        after = native()._end_event_counts()
        print("END_EVENTS", rank, *(a - b for a, b in zip(after, before)), flush=True)
        import fr_backend

        if rank == 0:
            print("DUMPED", fr_backend.dump("manual"), flush=True)
        dist.barrier()
        dist.destroy_process_group()
        return 0
    if scenario == "no_destroy":
        print(f"rank {rank} last line", time.time(), flush=True)
        return 0
    raise SystemExit(f"unknown scenario {scenario}")


if __name__ == "__main__":
    sys.exit(main())
