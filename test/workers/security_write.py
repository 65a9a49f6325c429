"""Worker for test_security_write.py: ranks that idle while the test writes into their TCPStore and dump folder.

    security_write.py STATE_DIR

Every rank is a plain env:// rank (dist_harness) on an frnccl default group whose timeout is SEC_PG_TIMEOUT
seconds (default 30), plus `hang_group` over every rank. Each rank writes `pid_<rank>`; rank 0 writes
`master_port`, and `running` once every rank is ready. Then each rank idles, with no collective, until `stop`
appears (at most IDLE_MAX_S), looking every 20 ms for:
  `dump_<rank>`: a JSON string, the reason for fr_backend.dump(reason); prints `LOCAL_DUMP <json>` with the
      folder it returned, or `{"error": <message>}`.
  `hang_<rank>`: an all_reduce on `hang_group`, which no other rank joins, so it times out and frnccl dumps
      job-wide; prints `OUTCOME <rank> raised <type>`.
Prints `DONE <rank>` last.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore", category=FutureWarning)

RANK = int(os.environ["RANK"])
IDLE_MAX_S = 120.0


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(state: Path) -> int:
    import fr_backend

    timeout = timedelta(seconds=float(os.environ.get("SEC_PG_TIMEOUT", "30")))
    dist.init_process_group("frnccl", init_method="env://", timeout=timeout)
    hang_group = dist.new_group(list(range(dist.get_world_size())), timeout=timeout)
    (state / f"pid_{RANK}").write_text(str(os.getpid()))
    if RANK == 0:
        (state / "master_port").write_text(os.environ["MASTER_PORT"])
    dist.barrier()
    if RANK == 0:
        (state / "running").write_text("1")
    end = time.monotonic() + IDLE_MAX_S
    while not (state / "stop").exists() and time.monotonic() < end:
        ask = state / f"dump_{RANK}"
        if ask.exists():
            reason = json.loads(ask.read_text())
            ask.unlink()
            try:
                say("LOCAL_DUMP " + json.dumps({"folder": fr_backend.dump(reason)}))
            except Exception as err:  # noqa: BLE001 - reported to the test
                say("LOCAL_DUMP " + json.dumps({"error": str(err)}))
        hang = state / f"hang_{RANK}"
        if hang.exists():
            hang.unlink()
            try:
                dist.all_reduce(torch.ones(4), group=hang_group)
                say(f"OUTCOME {RANK} UNEXPECTEDLY passed")
            except Exception as err:  # noqa: BLE001 - the timeout
                say(f"OUTCOME {RANK} raised {type(err).__name__}")
        time.sleep(0.02)
    say(f"DONE {RANK}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
