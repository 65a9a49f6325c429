"""A group whose library handles its failures, then a plain frnccl group on its recorder slot (test_wrap_inputs.py).

    library_slot_reuse.py

Life 1: each rank wraps a Gloo backend it built itself with `handles_failures=True` (as the torchft integration
does), runs one all_reduce through it and drops it. Life 2: `init_process_group("frnccl")`, whose default group
takes life 1's recorder slot; after one all_reduce, rank 1 stays out of the next one and rank 0 times out
there. frnccl must treat that timeout as its own (an incident and a verdict): the library's flag was its group's,
not its slot's. Rank 0 prints `RAISED <type>`; both print `DONE <rank>`.
"""

from __future__ import annotations

import gc
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from fr_backend import wrap

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def main() -> int:
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), WORLD, RANK == 0,
                          timeout=timedelta(seconds=60))
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("library", store), RANK, WORLD, timedelta(seconds=30))
    library = wrap.wrap_backend(gloo, store, RANK, WORLD, group_name="library", timeout=30.0, handles_failures=True)
    t = torch.ones(4)
    library.allreduce([t]).wait()
    assert t.tolist() == [float(WORLD)] * 4, t
    if store.add("library_done", 1) == WORLD:  # both ranks past their op before either drops the group
        store.set("library_all_done", "1")
    store.wait(["library_all_done"])
    del library, gloo
    gc.collect()

    dist.init_process_group("frnccl", store=dist.PrefixStore("main", store), rank=RANK, world_size=WORLD,
                            timeout=timedelta(seconds=3))
    dist.all_reduce(torch.ones(4))
    if RANK == 0:
        try:
            dist.all_reduce(torch.ones(4))
        except Exception as err:  # the timeout, raised after the incident's dump
            print(f"RAISED {type(err).__name__}", flush=True)
        store.set("rank0_done", "1")
        store.wait(["rank1_done"], timedelta(seconds=60))  # the store's host leaves last
    else:
        store.wait(["rank0_done"], timedelta(seconds=60))
        store.set("rank1_done", "1")
    print(f"DONE {RANK}", flush=True)
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
