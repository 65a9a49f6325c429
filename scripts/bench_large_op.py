#!/usr/bin/env python3
"""One job of 64 MB all_reduces on a bare group: frnccl's communicator and op path against plain nccl's.

    for b in nccl frnccl nccl frnccl; do
      TORCH_FR_BUFFER_SIZE=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING,ENV \\
        python3 -m torch.distributed.run --nproc-per-node 2 scripts/bench_large_op.py $b
    done

Each job initializes the default group with BACKEND bound to its GPU, warms up with 20 all_reduces of
64 MB, then times 5 blocks of 50 (µs per op; rank 0 prints one RESULT line). Nothing else runs in the job,
so a difference between alternating nccl and frnccl jobs is frnccl's; with NCCL_DEBUG=INFO the log also
shows the algorithm, protocol and channels NCCL chose for each group.
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    backend = sys.argv[1]
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group(backend, device_id=torch.device("cuda", local))
    t = torch.ones(16 * 1024 * 1024, device="cuda")
    for _ in range(20):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    blocks = []
    for _ in range(5):
        dist.barrier()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(50):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        blocks.append((time.perf_counter() - start) / 50 * 1e6)
    if dist.get_rank() == 0:
        print(f"RESULT {backend}: 64 MB us per op, 5 blocks: {[round(x, 1) for x in blocks]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
