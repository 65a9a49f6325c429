"""One rank leaves the job cleanly (destroy_process_group, exit 0) while the others enter the next all_reduce:
they time out, and the trigger's count finds the leaver's left mark, and its verdict reads the summary the
leaver posted as it left.

    verdict_leaver.py WARMUP LEAVER
"""

from __future__ import annotations

import sys

import torch.distributed as dist

from _incident import warmed_up_group


def main() -> int:
    warmup, leaver = int(sys.argv[1]), int(sys.argv[2])
    rank, t = warmed_up_group(warmup)
    if rank == leaver:
        dist.destroy_process_group()
        print(f"rank {rank} left", flush=True)
        return 0
    dist.all_reduce(t)  # the others wait here for the rank that left
    print(f"rank {rank} UNEXPECTEDLY passed the collective", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
