"""Restarts inside one process: LIVES rounds of init_process_group, ops, destroy_process_group.

    reinit.py STORE LIVES [hang]

STORE says where each life's store comes from:
  shared  one TCPStore for the whole run, hosted by the process started as rank 0, and a PrefixStore of it per
          life (as torchft does on every quorum). The processes swap ranks from one life to the next: in life i
          the process started as rank p is rank p in even lives and WORLD-1-p in odd ones.
  env     init_method="env://" in every life: torch builds a new TCPStore each time, hosted by rank 0 on a port
          the process started as rank 0 picks for that life (ranks are kept).
Each life runs all_reduces on the world group and on two frnccl subgroups, checked against the expected sums,
then destroys the groups. After each teardown the processes meet on a harness store of their own (the run's
store, or one on REINIT_SYNC_PORT for `env`), then each notes its socket fds and threads, once the count is
back where it was after the previous teardown (bounded: a leak is noted as the count it leaves), and how long
the life's init took. In life 0 and life 1 every rank also writes a local dump (fr_backend.dump), whose header
and file name must carry that life's rank.

With `hang`, the last life has one rank (the one numbered 1 in that life) stay out of an all_reduce on a
subgroup whose timeout is REINIT_PG_TIMEOUT_S: the other rank times out, the job dumps, and both wait (bounded)
for every rank's part of that dump before they tear down. Every other group has a long timeout, so that a slow
moment of the machine fails nothing.
Prints RESULT (notes: fds, threads, the recorder's group slots, init_s per life; dumps) and DONE_MONO.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import fr_backend
from _worker import RANK, WORLD, Checks

STORE, LIVES = sys.argv[1], int(sys.argv[2])
HANG = "hang" in sys.argv[3:]
BACKEND = os.environ.get("REINIT_BACKEND", "frnccl")  # gloo: the same run on plain gloo, for comparison
PG_TIMEOUT_S = float(os.environ.get("REINIT_PG_TIMEOUT_S", "30"))
WAIT_S = 60.0  # bound of every wait for another process's progress
SETTLE_S = 5.0  # how long sockets closed by a teardown (here and in the other process) may take to go
DUMP_DIR = Path(os.environ["FRNCCL_DUMP_DIR"])


def sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:  # closed while we looked (the listing's own fd)
            continue
    return count


def threads() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # ended while we looked
            continue
    return sorted(names)


def life_rank(life: int) -> int:
    if STORE == "shared" and life % 2 == 1:
        return WORLD - 1 - RANK
    return RANK


def wait_for_files(pattern: str, count: int) -> list[Path]:
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        found = sorted(DUMP_DIR.glob(pattern))
        if len(found) >= count:
            return found
        time.sleep(0.05)
    return sorted(DUMP_DIR.glob(pattern))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def meet(sync: dist.Store, name: str) -> None:
    """Every process got here (a barrier over the harness store, not frnccl's)."""
    sync.add(name, 1)
    end = time.monotonic() + WAIT_S
    while int(sync.add(name, 0)) < WORLD and time.monotonic() < end:
        time.sleep(0.02)


def settled_sockets(target: int | None) -> int:
    """The socket count once it is back at `target` (the last teardown's), or what it is after SETTLE_S."""
    end = time.monotonic() + SETTLE_S
    while target is not None and sockets() != target and time.monotonic() < end:
        time.sleep(0.02)
    return sockets()


def main() -> int:
    checks = Checks()
    base = None
    if STORE == "shared":
        base = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), WORLD, is_master=RANK == 0,
                             timeout=timedelta(seconds=WAIT_S), wait_for_workers=False)
        sync = base
    else:
        sync = dist.TCPStore("127.0.0.1", int(os.environ["REINIT_SYNC_PORT"]), WORLD, is_master=RANK == 0,
                             timeout=timedelta(seconds=WAIT_S), wait_for_workers=False)
    fds: list[int] = []
    nthreads: list[int] = []
    pg_slots: list[int] = []  # the recorder's group list (frnccl only)
    init_s: list[float] = []
    dumps: list[dict] = []
    long_timeout = timedelta(seconds=WAIT_S)
    for life in range(LIVES):
        rank = life_rank(life)
        start = time.monotonic()
        if base is not None:
            store = dist.PrefixStore(f"life{life}", base)
            dist.init_process_group(BACKEND, store=store, rank=rank, world_size=WORLD, timeout=long_timeout)
        else:
            # A fresh rendezvous port per life, as a new rendezvous gives: the same port again is not safe even
            # for plain gloo (its next init can read the last life's keys, or connect before the new host is up).
            if RANK == 0:
                sync.set(f"port{life}", str(free_port()))
            os.environ["MASTER_PORT"] = sync.get(f"port{life}").decode()
            dist.init_process_group(BACKEND, init_method="env://", rank=rank, world_size=WORLD, timeout=long_timeout)
        dist.barrier()
        subs = [dist.new_group(backend=BACKEND),
                dist.new_group(list(reversed(range(WORLD))), backend=BACKEND, timeout=timedelta(seconds=PG_TIMEOUT_S))]
        init_s.append(round(time.monotonic() - start, 3))
        want = torch.full((4,), float(WORLD * (WORLD + 1) // 2))
        for group in (None, *subs):
            t = torch.full((4,), float(rank + 1))
            dist.all_reduce(t, group=group)
            if not torch.equal(t, want):
                checks.fail(f"all_reduce_life{life}", f"{t.tolist()} != {want.tolist()}")
        if life < 2 and BACKEND == "frnccl":
            folder = Path(fr_backend.dump(f"life{life}"))
            files = sorted(p.name for p in (folder / "compact").iterdir())
            header = fr_backend.load_dump(str(folder / "compact" / files[0])) if files else {}
            dumps.append({"life": life, "rank": rank, "files": files, "header_rank": header.get("rank"),
                          "world_size": header.get("world_size"), "life_key": header.get("life"),
                          "pgs": sorted(header.get("pg_config", {})),
                          "entry_pgs": sorted({e["process_group"][0] for e in header.get("entries", [])})})
        if life == LIVES - 1 and HANG:
            hang(checks, rank, subs[1])
        dist.destroy_process_group()
        meet(sync, f"left{life}")
        fds.append(settled_sockets(fds[-1] if fds else None))
        nthreads.append(len(threads()))
        if BACKEND == "frnccl":
            from fr_backend._native import native

            pg_slots.append(native()._recorder_pg_slots())
    # The host outlives every other process's use of the harness store: the others' last call is this add.
    if RANK == 0:
        meet(sync, "done")
    else:
        sync.add("done", 1)
    checks.notes.update(fds=fds, threads=nthreads, pg_slots=pg_slots, init_s=init_s, dumps=dumps, last_rank=life_rank(LIVES - 1),
                        thread_names=threads())
    checks.report()
    print(f"DONE_MONO {time.monotonic()}", flush=True)
    return 0


def hang(checks: Checks, rank: int, group: dist.ProcessGroup) -> None:
    """Rank 1 of this life never joins; the others time out in the all_reduce. Every rank then waits for the
    job-wide dump (one file per rank) before it goes on to tear down."""
    if rank != 1:
        try:
            dist.all_reduce(torch.ones(4), group=group)
            checks.fail("hang", "the all_reduce returned though rank 1 never joined")
        except Exception as err:  # the timeout
            checks.notes["victim_error"] = str(err).splitlines()[0]
    found = wait_for_files("*-timeout-*/compact/frnccl_rank_*.json.gz", WORLD)
    checks.notes["incident_files"] = [str(p.relative_to(DUMP_DIR)) for p in found]


if __name__ == "__main__":
    sys.exit(main())
