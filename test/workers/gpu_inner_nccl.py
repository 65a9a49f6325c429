"""One rank on one GPU through frnccl's inner NCCL backend: whichever "nccl" builds in this process (nccl2 on
torch 2.15 unless TORCH_DIST_USE_NCCL2=0; the legacy ProcessGroupNCCL before 2.15). Run by
test/gpu/test_gpu_inner_nccl.py.

SCENARIO=healthy: collectives with known results; then memory_stats, suspend and resume, which reach NCCL
                  functions that a libnccl older than torch's lacks: each prints
                  `API <name> ok|refused <first line>` (a process that calls a missing one never prints).
SCENARIO=hang:    a GPU kernel that outlasts the group's timeout (GROUP_TIMEOUT_SEC) ahead of an all_reduce,
                  the main thread waiting for it in wait_behind_gpu_kernel(); frnccl's watchdog must dump and
                  abort, and the next call raise (`OUTCOME next call raised ...`).
SCENARIO=plain:   no frnccl: plain "nccl" and its backend's memory_stats, to see what torch itself does with the
                  NCCL it loaded (`PLAIN memory_stats ok|raised ...`; nothing, if the process was ended).
The others print `INNER <class> <name>` (the inner NCCL backend's Python class and its own name).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

GROUP_TIMEOUT = float(os.environ.get("GROUP_TIMEOUT_SEC", "10"))
# Cycles at about 2 GHz: long enough for the timeout and the dump, short enough to end the job soon after.
KERNEL_SEC = GROUP_TIMEOUT + 12


def wait_behind_gpu_kernel(x: torch.Tensor) -> None:
    torch.cuda._sleep(int(KERNEL_SEC * 2e9))
    dist.all_reduce(x)
    torch.cuda.synchronize()


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def main() -> int:
    torch.cuda.set_device(0)
    if os.environ["SCENARIO"] == "plain":
        dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
        nccl = dist.group.WORLD._get_backend(torch.device("cuda"))
        print(f"PLAIN backend {type(nccl).__name__}", flush=True)
        try:
            print(f"PLAIN memory_stats ok {nccl.memory_stats()}", flush=True)
        except Exception as err:
            print(f"PLAIN memory_stats raised {type(err).__name__}: {first_line(err)}", flush=True)
        dist.destroy_process_group()
        return 0
    dist.init_process_group("frnccl", timeout=timedelta(seconds=GROUP_TIMEOUT), device_id=torch.device("cuda", 0))
    frnccl = dist.group.WORLD._get_backend(torch.device("cuda"))
    inner = frnccl.cuda_backend
    print(f"INNER {type(inner).__name__} {inner.name()}", flush=True)
    x = torch.ones(1 << 10, device="cuda")
    if os.environ["SCENARIO"] == "healthy":
        dist.all_reduce(x)
        dist.broadcast(x, 0)
        out = torch.empty(1 << 10, device="cuda")
        dist.all_gather_into_tensor(out, x)
        dist.reduce_scatter_tensor(out, x)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        dist.barrier()
        torch.cuda.synchronize()
        print(f"OPS {'ok' if bool((x == 1).all()) and bool((out == 1).all()) else 'wrong'}", flush=True)
        if hasattr(frnccl, "memory_stats"):  # torch 2.13 and later
            for name, call in (("memory_stats", frnccl.memory_stats), ("suspend", frnccl.suspend),
                               ("resume", frnccl.resume)):
                try:
                    call()
                    print(f"API {name} ok", flush=True)
                except Exception as err:  # the refusal is the point; any other error is printed too
                    print(f"API {name} refused {first_line(err)}", flush=True)
        dist.destroy_process_group()
        return 0
    for _ in range(3):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    try:
        wait_behind_gpu_kernel(x)
        print("OUTCOME the op returned", flush=True)
    except Exception as err:
        print(f"OUTCOME the op raised {type(err).__name__}: {first_line(err)}", flush=True)
    try:
        dist.all_reduce(x)
        torch.cuda.synchronize()
        print("OUTCOME next call returned", flush=True)
    except Exception as err:
        print(f"OUTCOME next call raised {type(err).__name__}: {first_line(err)}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # the aborted group is not torn down: the point is that the process ends


if __name__ == "__main__":
    sys.exit(main())
