"""Workers for test_reliability.py: faults, bad dump folders, concurrent dump requests, many threads.

    reliability.py MODE STATE_DIR [ARGS...]

Every rank is a plain env:// rank (dist_harness) or a torchrun worker, on an frnccl
default group whose timeout is RELIABILITY_PG_TIMEOUT seconds (default 30).
STATE_DIR is where the test and the ranks meet: once its loop runs, a rank writes
`ppid_<rank>` (under torchrun: the launcher's pid) and `pid_<rank>`, and rank 0
writes `master_port` and then `running`; the test writes `stop` to end a loop.

MODE `loop` [BIG_ENTRIES [BIG_RANKS]]: first, each rank in BIG_RANKS (comma
    list, default: every rank) records BIG_ENTRIES ops issued from a deep Python
    stack on a group of its own (new_group([r]) per rank), so its dump is large
    and slow to write; then every rank loops over rounds until `stop` appears
    (rank 0 decides, the others follow through the round's all_reduce) or
    LOOP_MAX_S passed. A round: one all_reduce of RELIABILITY_PAYLOAD floats if
    set (a large op, for a rank to die inside), one all_reduce of the stop flag,
    a pause of RELIABILITY_PAUSE_S (default 0.02). An all_reduce that raises (a
    peer died) ends the loop: the rank prints `OUTCOME <rank> raised ...` and
    exits 3. The loop calls fr_backend.dump() once when `local_<rank>` appears
    and prints `LOCAL_DUMP <folder>` (or `LOCAL_DUMP_FAILED <message>`).
MODE `unwritable` N: N all_reduces, fr_backend.dump() (must fail, printing
    `LOCAL_DUMP_FAILED <message>`), a job-wide dump through SIGUSR1 on rank 0,
    N more all_reduces checked for the right sum; a RESULT line; exit 0.
    RELIABILITY_FSIZE (bytes), if set, is this process's RLIMIT_FSIZE, with
    SIGXFSZ ignored, so writes past it fail with EFBIG.
MODE `threads` GROUPS OPS: GROUPS frnccl groups over every rank; one thread per
    group issues OPS collectives (a mix) on its own group, all threads at once;
    then a RESULT line with fr_backend.trace_entries(symbolize=False) per group.
MODE `queued_dump`: rank 1 cannot write dumps (its FRNCCL_DUMP_DIR is under
    /proc), so a job-wide dump that rank 0 asks for (SIGUSR1) waits its whole
    deadline for it; once rank 0's own part is written, rank 0 calls
    fr_backend.dump(), which queues behind that wait, and prints a RESULT line
    with the call's wall and process CPU seconds; then writes `stop`, which
    rank 1 waits for (it prints a RESULT line of its rank only).
MODE `stale_lock`: rank 0 leaves a fresh-looking `frnccl/active` in the store
    (what a trigger that ended during its dump leaves, and torchrun keeps the
    store across restarts); then rank 0 waits in an all_reduce on one group
    and rank 1 on another, which the other rank never joins, so both time out
    at about the same time and both find that lock held. Each prints `OUTCOME
    <rank> raised ...`; once its dump is written it calls again (every 0.2 s,
    at most RELIABILITY_NEXT_CALLS_S seconds in all) until a call fails because
    frnccl aborted the groups, printing that call's `NEXT_CALL <rank> raised
    ...`; then writes `done_<rank>` and waits for the other's (its incident may
    still need this rank's dump); a RESULT line says whether it saw the abort.
MODE `host_leaves` STAY_S: 2 ranks, a few all_reduces; then rank 0, the host of
    the job's TCPStore, exits without destroy_process_group, as a rank that
    finished first does. Rank 1 goes on for STAY_S seconds without collectives
    (its monitor keeps looking in the store), then asks for a job-wide dump
    (SIGUSR1) and a local one (fr_backend.dump()), and prints a RESULT line
    with the folders they went to.
Every rank prints `DONE <rank>` and `DONE_MONO <time.monotonic()>` as its last lines.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore", category=FutureWarning)

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
LOOP_MAX_S = 60.0
BIG_DEPTH = 60  # Python frames under each big entry (frnccl keeps at most 64)


def say(line: str) -> None:
    # One write per line: ranks may share one stdout.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def init() -> None:
    timeout_s = float(os.environ.get("RELIABILITY_PG_TIMEOUT", "30"))
    dist.init_process_group("frnccl", init_method="env://", timeout=timedelta(seconds=timeout_s))


def deep(depth: int, fn) -> None:
    if depth <= 0:
        fn()
        return
    deep(depth - 1, fn)


def fill_big(solo: dist.ProcessGroup, n: int) -> None:
    t = torch.ones(4)

    def issue() -> None:
        for _ in range(n):
            dist.all_reduce(t, group=solo)

    deep(BIG_DEPTH, issue)


def loop(state: Path, big: int, big_ranks: set[int]) -> int:
    # Every rank creates every solo group, in the same order (new_group is collective).
    solos = [dist.new_group([r]) for r in range(WORLD)] if big else []
    if big and RANK in big_ranks:
        fill_big(solos[RANK], big)
    flag = torch.zeros(1)
    payload = torch.ones(int(os.environ.get("RELIABILITY_PAYLOAD", "0")))
    pause_s = float(os.environ.get("RELIABILITY_PAUSE_S", "0.02"))
    n = 0
    local_done = False
    end = time.monotonic() + LOOP_MAX_S
    while True:
        flag.zero_()
        if RANK == 0 and ((state / "stop").exists() or time.monotonic() > end):
            flag.fill_(1.0)
        try:
            if payload.numel():
                dist.all_reduce(payload)  # a large op: a rank killed now dies inside it
            dist.all_reduce(flag)
        except Exception as err:  # noqa: BLE001 - a peer died: report and leave
            say(f"OUTCOME {RANK} raised {type(err).__name__}: {str(err).splitlines()[0][:200]}")
            return 3
        n += 1
        if n == 1:
            (state / f"ppid_{RANK}").write_text(str(os.getppid()))  # under torchrun: the launcher
            (state / f"pid_{RANK}").write_text(str(os.getpid()))
            if RANK == 0:
                (state / "master_port").write_text(os.environ["MASTER_PORT"])
                (state / "running").write_text("1")
        if not local_done and (state / f"local_{RANK}").exists():
            local_done = True
            import fr_backend

            try:
                say(f"LOCAL_DUMP {fr_backend.dump()}")
            except Exception as err:  # noqa: BLE001
                say(f"LOCAL_DUMP_FAILED {err}")
        if flag.item() > 0:
            say(f"LOOPS {RANK} {n}")
            return 0
        time.sleep(pause_s)


def unwritable(n: int) -> int:
    import fr_backend

    t = torch.ones(64)
    ok = True
    for _ in range(n):
        t.fill_(RANK + 1)
        dist.all_reduce(t)
        ok &= bool(torch.all(t == WORLD * (WORLD + 1) / 2))
    try:
        say(f"LOCAL_DUMP {fr_backend.dump()}")
    except Exception as err:  # noqa: BLE001 - expected: the folder cannot be written
        say(f"LOCAL_DUMP_FAILED {str(err).splitlines()[0]}")
    dist.barrier()
    if RANK == 0:
        os.kill(os.getpid(), signal.SIGUSR1)  # a job-wide dump; every rank tries to write
    time.sleep(3.0)  # the monitors pick it up within 50 ms + FRNCCL_COORD_CHECK_MS
    for _ in range(n):
        t.fill_(RANK + 1)
        dist.all_reduce(t)
        ok &= bool(torch.all(t == WORLD * (WORLD + 1) / 2))
    b = torch.full((8,), float(RANK))
    dist.broadcast(b, src=WORLD - 1)
    ok &= bool(torch.all(b == WORLD - 1))
    say("RESULT " + json.dumps({"rank": RANK, "ops_ok": ok, "ops": 2 * n + 2}))
    dist.destroy_process_group()
    return 0


def threads(groups_n: int, ops: int) -> int:
    import fr_backend

    groups = [dist.new_group(backend="frnccl") for _ in range(groups_n)]
    start = threading.Barrier(groups_n)
    errors: list[str] = []
    wrong: list[str] = []
    idents: dict[int, int] = {}

    def work(i: int) -> None:
        g = groups[i]
        idents[i] = threading.get_ident()  # pthread_self(): what the recorder stores as thread_id
        try:
            start.wait(timeout=60)
            for k in range(ops):
                kind = k % 4
                if kind == 0:
                    t = torch.full((16,), float(RANK + i))
                    dist.all_reduce(t, group=g)
                    want = sum(r + i for r in range(WORLD))
                    if not bool(torch.all(t == want)):
                        wrong.append(f"group {i} op {k}: all_reduce gave {t[0].item()} not {want}")
                elif kind == 1:
                    t = torch.full((8,), float(RANK * 100 + k))
                    dist.broadcast(t, src=k % WORLD, group=g)
                    if not bool(torch.all(t == (k % WORLD) * 100 + k)):
                        wrong.append(f"group {i} op {k}: broadcast gave {t[0].item()}")
                elif kind == 2:
                    outs = [torch.zeros(4) for _ in range(WORLD)]
                    dist.all_gather(outs, torch.full((4,), float(RANK + 10 * i)), group=g)
                    if [int(o[0].item()) for o in outs] != [r + 10 * i for r in range(WORLD)]:
                        wrong.append(f"group {i} op {k}: all_gather gave {[o[0].item() for o in outs]}")
                else:
                    t = torch.full((32,), 1.0)
                    dist.all_reduce(t, group=g, async_op=True).wait()
        except Exception as err:  # noqa: BLE001
            errors.append(f"group {i}: {type(err).__name__}: {err}")

    workers = [threading.Thread(target=work, args=(i,)) for i in range(groups_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=240)
    alive = [w.name for w in workers if w.is_alive()]
    trace = fr_backend.trace_entries(symbolize=False)
    names = {i: dist._get_process_group_name(g) for i, g in enumerate(groups)}
    per_group: dict[str, dict] = {}
    for i, name in names.items():
        mine = [e for e in trace["entries"] if e["process_group"][0] == name]
        per_group[str(i)] = {
            "name": name,
            "seqs": [e["collective_seq_id"] for e in mine],
            "thread_ids": sorted({str(e["thread_id"]) for e in mine}),
            "issuer": str(idents.get(i)),
            "ops": sorted({e["profiling_name"] for e in mine}),
        }
    say("RESULT " + json.dumps({
        "rank": RANK,
        "errors": errors,
        "wrong": wrong[:20],
        "alive": alive,
        "record_ids": [e["record_id"] for e in trace["entries"]],
        "entries": len(trace["entries"]),
        "buffer_size": trace.get("buffer_size"),
        "groups": per_group,
    }))
    dist.destroy_process_group()
    return 0 if not errors and not alive else 4


def queued_dump(state: Path) -> int:
    import fr_backend

    t = torch.ones(4)
    for _ in range(5):
        dist.all_reduce(t)
    if RANK != 0:
        end = time.monotonic() + LOOP_MAX_S
        while not (state / "stop").exists() and time.monotonic() < end:
            time.sleep(0.05)
        say("RESULT " + json.dumps({"rank": RANK}))
        return 0
    os.kill(os.getpid(), signal.SIGUSR1)
    mine = Path(os.environ["FRNCCL_DUMP_DIR"])
    end = time.monotonic() + LOOP_MAX_S
    while not any(mine.glob("*-signal-*/pickle/frnccl_rank_0")) and time.monotonic() < end:
        time.sleep(0.02)
    # The monitor now waits for rank 1, which never writes: this dump is served after that wait.
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    try:
        where = fr_backend.dump()
    except Exception as err:  # noqa: BLE001
        where = f"FAILED {err}"
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - start
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    say("RESULT " + json.dumps({"rank": RANK, "dump": where, "wall_s": wall, "cpu_s": cpu}))
    (state / "stop").write_text("1")
    return 0


def stale_lock(state: Path) -> int:
    timeout = timedelta(seconds=float(os.environ.get("RELIABILITY_PG_TIMEOUT", "30")))
    groups = [dist.new_group([0, 1], timeout=timeout) for _ in range(2)]
    t = torch.ones(4)
    dist.all_reduce(t)
    if RANK == 0:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        store.set("frnccl/active", f"20261201-000000.000-timeout-r1|{time.time_ns()}")
    dist.barrier()
    mine = groups[RANK]  # the other rank never calls on it
    try:
        dist.all_reduce(t, group=mine)
        say(f"OUTCOME {RANK} UNEXPECTEDLY passed")
    except Exception as err:  # noqa: BLE001 - the timeout
        say(f"OUTCOME {RANK} raised {type(err).__name__}: {str(err).splitlines()[0][:300]}")
    deadline = time.monotonic() + float(os.environ.get("RELIABILITY_NEXT_CALLS_S", "40"))
    # Not before this rank's dump is written, so the dump still ends at the op that timed out.
    dumps = Path(os.environ["FRNCCL_DUMP_DIR"])
    while time.monotonic() < deadline and not any(dumps.glob(f"*/pickle/frnccl_rank_{RANK}")):
        time.sleep(0.05)
    aborted = False
    while time.monotonic() < deadline and not aborted:
        try:
            dist.all_reduce(t, group=mine)
        except Exception as err:  # noqa: BLE001 - gloo fails at once until the abort
            first = str(err).splitlines()[0]
            if "was aborted" in first:
                aborted = True
                say(f"NEXT_CALL {RANK} raised {type(err).__name__}: {first[:400]}")
        time.sleep(0.2)
    (state / f"done_{RANK}").write_text("1")
    end = time.monotonic() + LOOP_MAX_S
    while not (state / f"done_{1 - RANK}").exists() and time.monotonic() < end:
        time.sleep(0.05)
    say("RESULT " + json.dumps({"rank": RANK, "aborted": aborted}))
    return 0


def host_leaves(stay_s: float) -> int:
    import fr_backend

    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if RANK == 0:
        say("RESULT " + json.dumps({"rank": RANK}))
        return 0
    time.sleep(stay_s)
    dumps = Path(os.environ["FRNCCL_DUMP_DIR"])
    os.kill(os.getpid(), signal.SIGUSR1)
    end = time.monotonic() + LOOP_MAX_S
    while not any(dumps.glob("*-signal-*/pickle/frnccl_rank_1")) and time.monotonic() < end:
        time.sleep(0.05)
    signalled = sorted(str(p.parents[1]) for p in dumps.glob("*-signal-*/pickle/frnccl_rank_1"))
    try:
        local = fr_backend.dump()
    except Exception as err:  # noqa: BLE001
        local = f"FAILED {err}"
    say("RESULT " + json.dumps({"rank": RANK, "signalled": signalled, "local": local}))
    return 0


def main() -> int:
    mode, state = sys.argv[1], Path(sys.argv[2])
    if mode == "unwritable" and os.environ.get("RELIABILITY_FSIZE"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        limit = int(os.environ["RELIABILITY_FSIZE"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    if mode == "queued_dump" and RANK == 1:
        os.environ["FRNCCL_DUMP_DIR"] = "/proc/self/frnccl-dumps"
    init()
    if mode == "loop":
        big = int(sys.argv[3]) if len(sys.argv) > 3 else 0
        big_ranks = {int(r) for r in sys.argv[4].split(",")} if len(sys.argv) > 4 else set(range(WORLD))
        rc = loop(state, big, big_ranks)
        if rc == 0:
            dist.destroy_process_group()
    elif mode == "unwritable":
        rc = unwritable(int(sys.argv[3]))
    elif mode == "threads":
        rc = threads(int(sys.argv[3]), int(sys.argv[4]))
    elif mode == "queued_dump":
        rc = queued_dump(state)
    elif mode == "stale_lock":
        rc = stale_lock(state)
    elif mode == "host_leaves":
        rc = host_leaves(float(sys.argv[3]))
    else:
        raise SystemExit(f"unknown mode {mode}")
    say(f"DONE {RANK}")
    say(f"DONE_MONO {time.monotonic()}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
