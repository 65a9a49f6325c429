"""An unmodified training-style script: no `import fr_backend` anywhere.

The `torch.backends` entry point must register frnccl during `import torch`.
Usage (under torchrun or env://): plain_script.py [--destroy]
Prints `OK <backend> <fr_backend loaded>` after checking an all_reduce through
frnccl against its exact sum, then `DONE_MONO <time.monotonic()>` as its last act.
The script holds no plain gloo group: torch's Gloo workers can abort a process at
exit on their own ("terminate called without an active exception", when one drops
the last reference to a finished op while the interpreter finalizes), and this
script is about frnccl's exit.
"""

import os
import sys
import time

import torch
import torch.distributed as dist



def say(line: str) -> None:
    os.write(1, (line + "\n").encode())  # one write: ranks sharing torchrun's stdout don't interleave


dist.init_process_group(backend="frnccl")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.arange(1000, dtype=torch.float32) * (rank + 1)
dist.all_reduce(x)
expected = torch.arange(1000, dtype=torch.float32) * (world * (world + 1) // 2)
if not torch.equal(x, expected):
    sys.exit(f"all_reduce through frnccl gave {x[:5]}, not {expected[:5]}")
say(f"OK {dist.get_backend()} {'fr_backend._C' in sys.modules} {'LOCAL_RANK' in os.environ}")
if "--destroy" in sys.argv:
    dist.destroy_process_group()
say(f"DONE_MONO {time.monotonic()}")
