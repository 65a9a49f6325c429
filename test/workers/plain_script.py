"""An unmodified training-style script: no `import fr_backend` anywhere.

The `torch.backends` entry point must register frnccl during `import torch`.
Usage (under torchrun or env://): plain_script.py [--destroy]
Prints `OK <backend> <fr_backend loaded>` after checking an all_reduce through
frnccl against gloo, then `DONE_MONO <time.monotonic()>` as its last act.
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
gloo = dist.new_group(backend="gloo")
x = torch.arange(1000, dtype=torch.float32) * (rank + 1)
ref = x.clone()
dist.all_reduce(x)
dist.all_reduce(ref, group=gloo)
if not torch.equal(x, ref):
    sys.exit(f"all_reduce through frnccl {x[:5]} differs from gloo {ref[:5]}")
say(f"OK {dist.get_backend()} {'fr_backend._C' in sys.modules} {'LOCAL_RANK' in os.environ}")
if "--destroy" in sys.argv:
    dist.destroy_process_group()
say(f"DONE_MONO {time.monotonic()}")
