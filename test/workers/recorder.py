"""What frnccl's recorder holds after a known sequence of ops (world size 2 or 4).

Checks fr_backend.trace_entries() for: profiling names, collective_seq_id +1 per
collective per group, p2p_seq_id per send/recv, peers, sizes, dtypes, state
"completed" after wait (the watchdog gets up to POLL_S to notice), an op still
in flight not shown as completed, pg_status and pg_config. Results of each op
are also compared with a gloo group, so the recorded ops really ran.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

import fr_backend
from fr_backend import members
from _worker import RANK, WORLD, Checks, finish, init

POLL_S = 1.0

init("frnccl")
checks = Checks()
GLOO = dist.new_group(backend="gloo")
G = dist.new_group(backend="frnccl")  # fresh group: its sequence numbers start here
SUB = None
if WORLD == 4:
    subs = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    SUB = subs[RANK % 2]


def entries_of(trace: dict, group) -> list[dict]:
    return [e for e in trace["entries"] if e["process_group"][0] == group.group_name]


def wait_completed(group, count: int) -> tuple[list[dict], float]:
    """Poll until the group's last `count` entries are all completed (or POLL_S passes)."""
    start = time.monotonic()
    while True:
        es = entries_of(fr_backend.trace_entries(symbolize=False), group)
        if len(es) >= count and all(e["state"] == "completed" for e in es[-count:]):
            return es, time.monotonic() - start
        if time.monotonic() - start > POLL_S:
            return es, time.monotonic() - start


def field(es: list[dict], key: str) -> list:
    return [e[key] for e in es]


# ---- a known sequence on G; every result compared with gloo ----
def sequence(g):
    out = []
    t = torch.arange(1000, dtype=torch.float32) * (RANK + 1)
    dist.all_reduce(t, group=g)  # 1
    out.append(t)
    b = torch.full((3, 5), RANK, dtype=torch.int64)
    dist.broadcast(b, src=1, group=g, async_op=True).wait()  # 2
    out.append(b)
    ag = torch.zeros(7 * WORLD, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(ag, torch.full((7,), RANK, dtype=torch.bfloat16), group=g)  # 3
    out.append(ag)
    rs = torch.zeros(4, dtype=torch.float64)
    dist.reduce_scatter_tensor(rs, torch.arange(4 * WORLD, dtype=torch.float64) + RANK, group=g)  # 4
    out.append(rs)
    dist.barrier(group=g)  # 5
    p = torch.zeros(6, dtype=torch.int32)
    if RANK == 0:
        dist.send(torch.arange(6, dtype=torch.int32) + 100, dst=1, group=g)  # p2p 1
        dist.recv(p, src=1, group=g)  # p2p 2
    elif RANK == 1:
        dist.recv(p, src=0, group=g)
        dist.send(p + 1, dst=0, group=g)
    out.append(p)
    x = torch.ones(2, 2, dtype=torch.float16) * RANK
    dist.all_reduce(x, op=dist.ReduceOp.MAX, group=g, async_op=True).wait()  # 6
    out.append(x)
    return out


checks.compare("sequence_results", sequence, GLOO, G)
n_ops = 8 if RANK in (0, 1) else 6
es, waited = wait_completed(G, n_ops)
checks.notes["completed_after_s"] = round(waited, 3)
checks.expect("entry_count", len(es) == n_ops, f"{len(es)} entries for G, want {n_ops}: {field(es, 'profiling_name')}")
checks.expect("all_completed", all(e["state"] == "completed" for e in es) and waited <= POLL_S,
              f"not completed {waited:.2f}s after wait(): {[(e['profiling_name'], e['state']) for e in es if e['state'] != 'completed']}")

coll = [e for e in es if not e["is_p2p"]]
p2p = [e for e in es if e["is_p2p"]]
checks.expect("collective_names", field(coll, "profiling_name") == [
    "gloo:all_reduce", "gloo:broadcast", "gloo:_all_gather_base", "gloo:_reduce_scatter_base",
    "gloo:barrier", "gloo:all_reduce"], str(field(coll, "profiling_name")))
checks.expect("collective_seq_ids", field(coll, "collective_seq_id") == [1, 2, 3, 4, 5, 6],
              str(field(coll, "collective_seq_id")))
checks.expect("collective_p2p_seq_zero", all(e["p2p_seq_id"] == 0 and e["peer"] == -1 for e in coll),
              str([(e["p2p_seq_id"], e["peer"]) for e in coll]))
checks.expect("op_ids_increase", field(es, "op_id") == sorted(field(es, "op_id")) and len(set(field(es, "op_id"))) == len(es),
              str(field(es, "op_id")))
checks.expect("sizes", [(e["input_sizes"], e["output_sizes"]) for e in coll[:4]] == [
    ([[1000]], [[1000]]), ([[3, 5]], [[3, 5]]), ([[7]], [[7 * WORLD]]), ([[4 * WORLD]], [[4]])],
    str([(e["input_sizes"], e["output_sizes"]) for e in coll]))
checks.expect("dtypes", [(e["input_dtypes"], e["output_dtypes"]) for e in coll] == [
    (["Float"], ["Float"]), (["Long"], ["Long"]), (["BFloat16"], ["BFloat16"]), (["Double"], ["Double"]),
    ([], []), (["Half"], ["Half"])], str([(e["input_dtypes"], e["output_dtypes"]) for e in coll]))
if RANK == 0:
    want_p2p = [("gloo:send 0->1", 1, 1), ("gloo:recv 0<-1", 2, 1)]
elif RANK == 1:
    want_p2p = [("gloo:recv 1<-0", 1, 0), ("gloo:send 1->0", 2, 0)]
else:
    want_p2p = []
got_p2p = [(e["profiling_name"], e["p2p_seq_id"], e["peer"]) for e in p2p]
checks.expect("p2p_entries", got_p2p == want_p2p, f"{got_p2p} != {want_p2p}")
checks.expect("p2p_collective_seq_zero", all(e["collective_seq_id"] == 0 for e in p2p), str(field(p2p, "collective_seq_id")))
checks.expect("p2p_sizes", all(e["input_sizes"] == [[6]] and e["input_dtypes"] == ["Int"] for e in p2p),
              str([(e["input_sizes"], e["input_dtypes"]) for e in p2p]))

trace = fr_backend.trace_entries(symbolize=False)
status = [s for s in trace["pg_status"].values() if s["process_group"] == G.group_name]
want_last_p2p = 2 if RANK in (0, 1) else 0
checks.expect("pg_status", len(status) == 1 and status[0]["last_enqueued_collective"] == 6
              and status[0]["last_completed_collective"] == 6 and status[0]["last_completed_p2p"] == want_last_p2p,
              str(status))
config = [c for c in trace["pg_config"].values() if c["name"] == G.group_name]
checks.expect("pg_config", len(config) == 1 and members.decode(config[0]["members"], WORLD) == list(range(WORLD))
              and "ranks" not in config[0]
              and config[0]["size"] == WORLD and config[0]["backend"] == "gloo", str(config))

# ---- default group: named and described like torch's ----
dist.all_reduce(torch.ones(1))
es, _ = wait_completed(dist.group.WORLD, 1)
checks.expect("default_pg_entry", bool(es) and es[-1]["profiling_name"] == "gloo:all_reduce"
              and tuple(es[-1]["process_group"]) == (dist.group.WORLD.group_name, "default_pg"),
              str(es[-1:] and es[-1]["process_group"]))

# ---- an op still in flight is not reported completed ----
buf = torch.zeros(10)
if RANK == 1:
    w = dist.irecv(buf, src=0, group=G)
    time.sleep(0.3)  # rank 0 has not sent yet (it waits on the gloo barrier below)
    last = entries_of(fr_backend.trace_entries(symbolize=False), G)[-1]
    checks.expect("in_flight_not_completed", last["profiling_name"] == "gloo:recv 1<-0" and last["state"] != "completed",
                  f"{last['profiling_name']} {last['state']}")
dist.barrier(group=GLOO)
if RANK == 0:
    dist.send(torch.arange(10, dtype=torch.float32), dst=1, group=G)
if RANK == 1:
    w.wait()
    es, waited = wait_completed(G, 1)
    checks.expect("in_flight_then_completed", es[-1]["state"] == "completed" and es[-1]["p2p_seq_id"] == 3
                  and torch.equal(buf, torch.arange(10, dtype=torch.float32)), f"{es[-1]['state']} {es[-1]['p2p_seq_id']} {buf}")

# ---- p2p on a subgroup: group-local ranks in the name, global rank as peer ----
if SUB is not None:
    members = [0, 2] if RANK % 2 == 0 else [1, 3]
    t = torch.zeros(3)
    if RANK == members[0]:
        dist.send(torch.ones(3), dst=members[1], group=SUB)
    else:
        dist.recv(t, src=members[0], group=SUB)
        checks.expect("sub_recv_value", torch.equal(t, torch.ones(3)), str(t))
    es, _ = wait_completed(SUB, 1)
    want = ("gloo:send 0->1", members[1]) if RANK == members[0] else ("gloo:recv 1<-0", members[0])
    got = (es[-1]["profiling_name"], es[-1]["peer"]) if es else None
    checks.expect("sub_p2p_entry", got == want and es[-1]["p2p_seq_id"] == 1 and es[-1]["state"] == "completed",
                  f"{got} != {want}; {es[-1:] and (es[-1]['p2p_seq_id'], es[-1]['state'])}")

finish(checks)
