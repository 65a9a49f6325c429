"""An idle frnccl job on a FileStore (file:// init).

    store_file_idle.py STORE_FILE FLAG_DIR

Each rank builds its group on the file, runs a few all_reduces, creates FLAG_DIR/ready-<rank>, then stays
idle, touching neither the store nor the file, until FLAG_DIR/done exists (looked for every 50 ms: a wait()
on the FileStore would itself read the file every 10 ms). Then it destroys the group and prints `DONE <rank>`.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def main() -> int:
    store_file, flags = sys.argv[1], sys.argv[2]
    dist.init_process_group("frnccl", init_method=f"file://{store_file}", rank=RANK, world_size=WORLD,
                            timeout=timedelta(seconds=30))
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    open(os.path.join(flags, f"ready-{RANK}"), "w").close()
    done = os.path.join(flags, "done")
    end = time.monotonic() + 90
    while not os.path.exists(done) and time.monotonic() < end:
        time.sleep(0.05)
    dist.destroy_process_group()
    print(f"DONE {RANK}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
