"""Ring-buffer behaviour (2 ranks), run with FRNCCL_BUFFER_SIZE=8 or 0.

`wrap` (FRNCCL_BUFFER_SIZE=8): a known sequence of 12 ops on three frnccl groups
A (the default group), B and C; reports the trace and the sequence issued so
the test can compute which entries were evicted. C's only op is recorded last,
so C loses nothing.

`off` (FRNCCL_BUFFER_SIZE=0): collectives still give the right results, and the
recorder holds nothing (in-process and in a dump).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import fr_backend
from _worker import RANK, WORLD, init

MODE = sys.argv[1]
init("frnccl")
A = dist.group.WORLD
B = dist.new_group(backend="frnccl")
C = dist.new_group(backend="frnccl")
GROUPS = {"A": A, "B": B, "C": C}
issued: list[tuple[str, str, int]] = []  # (group, "coll" | "p2p", seq) in record order
seqs: dict[tuple[str, str], int] = {}


def coll(g: str) -> None:
    t = torch.ones(3) * (RANK + 1)
    dist.all_reduce(t, group=GROUPS[g])
    assert torch.equal(t, torch.full((3,), float(sum(range(1, WORLD + 1))))), t
    seqs[(g, "coll")] = seqs.get((g, "coll"), 0) + 1
    issued.append((g, "coll", seqs[(g, "coll")]))


def p2p(g: str) -> None:
    t = torch.zeros(2)
    if RANK == 0:
        dist.send(torch.ones(2), dst=1, group=GROUPS[g])
    else:
        dist.recv(t, src=0, group=GROUPS[g])
        assert torch.equal(t, torch.ones(2)), t
    seqs[(g, "p2p")] = seqs.get((g, "p2p"), 0) + 1
    issued.append((g, "p2p", seqs[(g, "p2p")]))


if MODE == "wrap":
    for step in ["A", "A", "B", "pA", "A", "B", "pA", "A", "A", "A", "C", "A"]:
        p2p(step[1]) if step.startswith("p") else coll(step)
    time.sleep(0.3)  # completions seen by the watchdog
    trace = fr_backend.trace_entries(symbolize=False)
    print("RESULT " + json.dumps({
        "rank": RANK,
        "issued": issued,
        "names": {k: g.group_name for k, g in GROUPS.items()},
        "entries": [{k: e[k] for k in ("record_id", "process_group", "collective_seq_id", "p2p_seq_id", "is_p2p", "state")}
                    for e in trace["entries"]],
        "pg_status": list(trace["pg_status"].values()),
        "buffer_size": trace["buffer_size"],
    }), flush=True)
elif MODE == "off":
    for g in "ABC":
        for _ in range(5):
            coll(g)
    p2p("A")
    out = [torch.zeros(2) for _ in range(WORLD)]
    dist.all_gather(out, torch.full((2,), float(RANK)))
    gathered_ok = all(torch.equal(o, torch.full((2,), float(r))) for r, o in enumerate(out))
    trace = fr_backend.trace_entries()
    folder = fr_backend.dump()
    dumped = fr_backend.load_dump(os.path.join(folder, "compact", f"frnccl_rank_{RANK}.json.gz"))
    print("RESULT " + json.dumps({
        "rank": RANK,
        "ops_ok": len(issued) == 16 and gathered_ok,
        "inproc_entries": len(trace["entries"]),
        "inproc_buffer_size": trace["buffer_size"],
        "dump_entries": len(dumped["entries"]),
        "dump_buffer_size": dumped["buffer_size"],
        "dump_pg_names": sorted(c["name"] for c in dumped["pg_config"].values()),
        "pg_names": sorted(g.group_name for g in GROUPS.values()),
    }), flush=True)
else:
    raise SystemExit(f"unknown mode {MODE}")
dist.destroy_process_group()
sys.stdout.flush()
