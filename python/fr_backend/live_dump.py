"""`frnccl dump --store HOST:PORT`: ask a running job to dump on every rank."""

from __future__ import annotations

import argparse
import re
import socket
import sys
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .analyzer.fmt import clean, rank_word
from .analyzer.model import first_line

SEQ_KEY = "frnccl/incident_seq"
ACTIVE_KEY = "frnccl/active"
WORLD_KEY = "frnccl/world_size"
# torchrun's rendezvous store points at the workers' own store with keys like
# "torch.rendezvous.<run id>.<round>/MASTER_PORT".
_RDZV_PORT_KEY = re.compile(r"^torch\.rendezvous\..*\.(\d+)/MASTER_PORT$")
# A lock whose incident has not asked the ranks to dump after this long is taken over: the ranks' rule
# (HeartbeatMonitor::kJoinedRequestGraceMs).
STALE_LOCK_S = 10.0
# A dump still holding the lock after two dump deadlines (FRNCCL_DUMP_TIMEOUT_SEC's default) is over, by
# the ranks' rule (HeartbeatMonitor::acquireActive).
STALE_DUMP_S = 2 * 60.0
MAX_WORLD = 1 << 20
# Each rank waits on its own wake key (HeartbeatMonitor's StoreWaiter); a request is announced by setting
# them all, this many per multi_set (the ranks' kWakeBatch).
WAKE_BATCH = 1024
# Ranks that left the job (the ranks' kLeftRanksKey): "+<rank>," when one leaves, "-<rank>," when it comes back.
LEFT_RANKS_KEY = "frnccl/left_ranks"
# How often the wait reads that list: a rank that left will not write, and the wait need not last for it.
LEFT_CHECK_S = 1.0


class LiveDumpError(Exception):
    """Why a live dump could not be requested, in one line."""


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("dump", help="ask a running job to dump on every rank (through its TCPStore)")
    p.add_argument("--store", required=True, metavar="HOST:PORT",
                   help="the job's store: MASTER_ADDR:MASTER_PORT, or torchrun's --rdzv-endpoint")
    p.add_argument("--reason", default="manual request from frnccl dump", help="text written into every dump")
    p.add_argument("--world-size", type=int, default=0, help="ranks to wait for (default: what the job reports)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for every rank to write")
    p.set_defaults(func=run)


def _parse_endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not (0 < int(port) < 65536):
        raise LiveDumpError(f"--store must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _connect(host: str, port: int) -> Any:
    with warnings.catch_warnings():
        # What torch says while it imports (such as "Failed to initialize NumPy") is about torch, not this
        # command, whose output is its own lines only.
        warnings.simplefilter("ignore")
        from torch.distributed import TCPStore

    try:
        # torch's client retries a refused connection for its whole timeout and logs each try with a C++
        # backtrace: a plain connect says first, in one line, that nothing listens there.
        socket.create_connection((host, port), timeout=5).close()
    except OSError as err:
        raise LiveDumpError(f"cannot reach the store at {host}:{port}: {err.strerror or err}") from None
    try:
        return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=10), wait_for_workers=False)
    except Exception as err:  # refused, unreachable, timed out
        raise LiveDumpError(f"cannot reach the store at {host}:{port}: {first_line(err, 200)}") from None


def _workers_store(store: Any, host: str, port: int) -> Any:
    """The store the ranks use: this one, or the one torchrun's rendezvous store points at."""
    if store.check([WORLD_KEY]):
        return store
    try:
        keys = store.list_keys()
    except Exception:
        keys = []
    rounds = sorted(
        ((int(m.group(1)), key) for key in keys if (m := _RDZV_PORT_KEY.match(key))), reverse=True
    )
    for _, key in rounds:
        try:
            worker_port = int(store.get(key).decode("utf-8", "replace"))
        except ValueError:
            continue  # not a port: another round may hold one
        addr_key = key.rsplit("/", 1)[0] + "/MASTER_ADDR"
        worker_host = store.get(addr_key).decode() if store.check([addr_key]) else host
        for candidate in dict.fromkeys((worker_host, host)):
            try:
                workers = _connect(candidate, worker_port)
            except LiveDumpError:
                continue
            if workers.check([WORLD_KEY]):
                return workers
    raise LiveDumpError(f"no frnccl job found behind {host}:{port} (no rank has registered there)")


def _shown(value: str) -> str:
    """A store value in a message: escaped (no control character reaches the terminal) and cut."""
    v = clean(value)
    return v if len(v) <= 80 else v[:80] + "..."


def registered_world_size(store: Any) -> int:
    """What the ranks registered as the job's size; any store client can write that key."""
    raw = store.get(WORLD_KEY).decode("utf-8", "replace")
    try:
        world = int(raw)
    except ValueError:
        raise LiveDumpError(f"{WORLD_KEY} in the store is not a number ({_shown(raw)!r}); "
                            "give the job's size with --world-size") from None
    if not 0 < world <= MAX_WORLD:
        raise LiveDumpError(f"{WORLD_KEY} in the store is {world}, not a job size (1-{MAX_WORLD}); "
                            "give the job's size with --world-size")
    return world


def _lock_taken_ns(held: str) -> int:
    """When the lock "<incident>|<wall ns>" was taken; 0 (long ago) when that cannot be read, as the ranks
    read it (HeartbeatMonitor's lockTakenNs)."""
    try:
        return int(held.rpartition("|")[2])
    except ValueError:
        return 0


def _requested(store: Any, incident: str) -> bool:
    """Whether the latest request in the store is for ``incident`` (its holder asked the ranks to dump)."""
    if not store.check([SEQ_KEY]):
        return False
    try:
        seq = int(store.get(SEQ_KEY).decode("utf-8", "replace"))
    except ValueError:
        return False
    key = f"frnccl/incident/{seq}"
    return store.check([key]) and store.get(key).decode("utf-8", "replace").split("\n", 1)[0] == incident


def _acquire(store: Any, mine: str) -> None:
    """Take the job-wide dump lock, by the ranks' rules: a lock whose incident never asked the ranks to dump
    is taken over once it is STALE_LOCK_S old (a trigger that died between the two store calls, or a store
    that outlived its job); one whose request is out belongs to a dump in progress and is refused, until it
    is STALE_DUMP_S old."""
    seen, since = "", 0.0  # the lock last seen, and when this command first saw it
    while True:
        held = store.compare_set(ACTIVE_KEY, "", mine).decode("utf-8", "replace")
        if held == mine:
            return
        if held != seen:
            seen, since = held, time.monotonic()
        incident = held.rpartition("|")[0] or held
        age_s = (time.time_ns() - _lock_taken_ns(held)) / 1e9
        if age_s < STALE_DUMP_S and _requested(store, incident):
            raise LiveDumpError(f"incident {_shown(incident)} is already being dumped; try again when it is done")
        waited_s = time.monotonic() - since
        # its request may still come: wait as the ranks do, from when the lock was taken or, should its
        # holder's clock be ahead of ours, from now
        if age_s < STALE_LOCK_S and waited_s < STALE_LOCK_S:
            time.sleep(0.2)
            continue
        got = store.compare_set(ACTIVE_KEY, held, mine).decode("utf-8", "replace")
        if got in (mine, held):  # ours; or (TCPStore's answer when the key is gone) freed meanwhile: try again
            if got == mine:
                why = "it never asked the ranks to dump" if age_s < STALE_DUMP_S else "its dump is long over"
                print(f"frnccl: took over the dump lock of incident {_shown(incident)}: {why} "
                      f"(taken {max(age_s, waited_s):.0f} s ago)", file=sys.stderr)
                return
            continue
        # another client took it over first: judge its lock afresh


def wake_key(rank: int) -> str:
    return f"frnccl/wake/{rank}"


def publish(store: Any, incident: str, reason: str, world: int) -> int:
    """Publish the request of ``incident`` (the caller holds the lock) and wake every rank; returns its
    number. A rank reads requests when its wake key is set: without the wake it would see this one only at
    its wait's bound (minutes)."""
    seq = int(store.add(SEQ_KEY, 1))
    store.set(f"frnccl/incident/{seq}", f"{incident}\nmanual\n-1\n{reason}")
    wake_all(store, world)
    return seq


def wake_all(store: Any, world: int) -> None:
    """Sets every rank's wake key: its monitor reads the store now, not at its wait's bound (minutes)."""
    for start in range(0, world, WAKE_BATCH):
        ranks = range(start, min(start + WAKE_BATCH, world))
        store.multi_set([wake_key(r) for r in ranks], ["1"] * len(ranks))


def open_job(endpoint: str, world_size: int) -> tuple[Any, int]:
    """The store the ranks of the job at ``endpoint`` use, and the job's size (``world_size`` if given).
    Raises LiveDumpError, in one line, for an endpoint, store or size that is not usable."""
    host, port = _parse_endpoint(endpoint)
    store = _workers_store(_connect(host, port), host, port)
    if world_size < 0 or world_size > MAX_WORLD:
        raise LiveDumpError(f"--world-size {world_size} is not a job size (1-{MAX_WORLD})")
    return store, world_size or registered_world_size(store)


JOB_TAG_KEY = "frnccl/job_tag"  # the job's tag, left by its first rank (HeartbeatMonitor::withJobTag)
_JOB_TAG = re.compile(r"[0-9a-f]{8}")


def _job_part(store: Any) -> str:
    """"job.<tag>-" for the incident's name, as the ranks name theirs (newIncidentId); "" where the store holds
    no tag (a job of an older frnccl) or something that is none."""
    try:
        tag = store.get(JOB_TAG_KEY).decode("ascii", "replace") if store.check([JOB_TAG_KEY]) else ""
    except Exception:  # noqa: BLE001 - the name goes without it; the request itself reports a store that is gone
        return ""
    return f"job.{tag}-" if _JOB_TAG.fullmatch(tag) else ""


def ranks_in_list(text: str, world: int) -> set[int]:
    """The ranks of ``world`` a store list names: "<rank>," entries (frnccl/writers/<id>), or "+<rank>," and
    "-<rank>," where a rank's last entry counts (frnccl/left_ranks). Anything else is skipped: any client of the
    store may append (the ranks' ranksInList)."""
    on: dict[int, bool] = {}
    for item in text.split(","):
        sign, digits = (item[0], item[1:]) if item[:1] in ("+", "-") else ("+", item)
        if 0 < len(digits) <= 9 and digits.isascii() and digits.isdigit() and int(digits) < world:
            on[int(digits)] = sign == "+"
    return {r for r, yes in on.items() if yes}


def _read_list(store: Any, key: str) -> str:
    return store.get(key).decode("ascii", "replace") if store.check([key]) else ""


def _writers(store: Any, incident: str, world: int) -> set[int]:
    return ranks_in_list(_read_list(store, f"frnccl/writers/{incident}"), world)


@dataclass
class DumpOutcome:
    folder: str
    written: int
    world: int
    left: list[int]  # ranks that left the job without writing (the wait ends without them)


def request_dump(endpoint: str, reason: str, world_size: int, timeout: float) -> DumpOutcome:
    """Publish a job-wide request and wait until every rank wrote, or left the job, or ``timeout``."""
    store, world = open_job(endpoint, world_size)
    incident = (time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d}-"
                + _job_part(store) + "manual-cli")
    lock_value = f"{incident}|{time.time_ns()}"
    _acquire(store, lock_value)
    written = 0
    left: set[int] = set()
    try:
        publish(store, incident, reason, world)
        print(f"frnccl: asked {world} ranks to dump (incident {incident})", file=sys.stderr)
        deadline = time.monotonic() + timeout
        next_left_check = 0.0
        while time.monotonic() < deadline:
            written = store.add(f"frnccl/written/{incident}", 0)
            if written >= world:
                break
            if time.monotonic() >= next_left_check:
                next_left_check = time.monotonic() + LEFT_CHECK_S
                gone = ranks_in_list(_read_list(store, LEFT_RANKS_KEY), world)
                # each rank once: one that wrote and then left is in both lists
                if gone and written + len(gone) >= world and len(_writers(store, incident, world) | gone) >= world:
                    break
            time.sleep(0.2)
        try:  # the last word: a rank names itself among the writers before it adds to the count
            wrote = _writers(store, incident, world)
            left = ranks_in_list(_read_list(store, LEFT_RANKS_KEY), world) - wrote
            written = max(written, len(wrote))
        except Exception:  # noqa: BLE001 - the store went as the wait ended: the count is what there is
            pass
    except Exception as err:  # the job ended under us
        raise LiveDumpError(f"lost the store while waiting ({first_line(err, 200)}); {written} ranks had written") from None
    finally:
        try:
            store.delete_key(ACTIVE_KEY)
        except Exception:
            pass
    folder = f"<FRNCCL_DUMP_DIR>/{incident}"
    try:
        if store.check(["frnccl/dump_dir"]):
            folder = f"{clean(store.get('frnccl/dump_dir').decode('utf-8', 'replace'))}/{incident}"
    except Exception:
        pass
    return DumpOutcome(folder, written, world, sorted(left))


def run(args: argparse.Namespace) -> int:
    try:
        got = request_dump(args.store, args.reason, args.world_size, args.timeout)
    except LiveDumpError as err:
        print(f"frnccl: {err}", file=sys.stderr)
        return 2
    gone = f"; {rank_word(got.left)} had left the job" if got.left else ""
    print(f"dump {got.folder.rsplit('/', 1)[-1]}: {got.written}/{got.world} ranks wrote{gone}; files under "
          f"{got.folder} on each rank's host")
    return 0 if got.written >= got.world else 1
