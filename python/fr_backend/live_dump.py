"""`frnccl dump --store HOST:PORT`: ask a running job to dump on every rank."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta

SEQ_KEY = "frnccl/incident_seq"
ACTIVE_KEY = "frnccl/active"


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("dump", help="ask a running job to dump on every rank (through its TCPStore)")
    p.add_argument("--store", required=True, metavar="HOST:PORT", help="the job's store: MASTER_ADDR:MASTER_PORT (torchrun: the rendezvous endpoint)")
    p.add_argument("--reason", default="manual request from frnccl dump", help="text written into every dump")
    p.add_argument("--world-size", type=int, default=0, help="ranks to wait for (default: ask the store)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for every rank to write")
    p.set_defaults(func=run)


def _parse_endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not (0 < int(port) < 65536):
        raise ValueError(f"--store must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def run(args: argparse.Namespace) -> int:
    try:
        host, port = _parse_endpoint(args.store)
    except ValueError as err:
        print(f"frnccl: {err}", file=sys.stderr)
        return 2
    from torch.distributed import TCPStore

    try:
        store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=10), wait_for_workers=False)
    except Exception as err:  # connection refused, timeout, bad host
        print(f"frnccl: cannot reach the store at {host}:{port}: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    incident = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-manual-cli"
    lock_value = f"{incident}|{time.time_ns()}"
    held = store.compare_set(ACTIVE_KEY, "", lock_value).decode()
    if held != lock_value:
        print(f"frnccl: incident {held.split('|')[0]} is already being dumped; not starting another", file=sys.stderr)
        return 1
    seq = store.add(SEQ_KEY, 1)
    store.set(f"frnccl/incident/{seq}", f"{incident}\nmanual\n-1\n{args.reason}")
    print(f"frnccl: asked the job to dump (incident {incident})", file=sys.stderr)
    world = args.world_size
    if not world and store.check(["frnccl/world_size"]):
        world = int(store.get("frnccl/world_size").decode() or 0)
    deadline = time.monotonic() + args.timeout
    written = 0
    try:
        while time.monotonic() < deadline:
            written = store.add(f"frnccl/written/{incident}", 0)
            if world and written >= world:
                break
            time.sleep(0.2)
    finally:
        store.delete_key(ACTIVE_KEY)
    total = f"/{world}" if world else ""
    print(f"dump {incident}: {written}{total} ranks wrote; files are under each rank's FRNCCL_DUMP_DIR/{incident}/")
    return 0 if written and (not world or written >= world) else 1
