"""One rank whose caller's source file name is not valid UTF-8 (a folder named in Latin-1, as
os.fsdecode gives it: a lone surrogate), then a dump with Python stacks. Reports the frames'
file names as the dump holds them."""

from __future__ import annotations

import glob
import json
import os

import torch
import torch.distributed as dist

import fr_backend
from _worker import RANK, init
from fr_backend.analyzer.load import load_dump

init("frnccl")
name = os.fsdecode(b"/data/caf\xe9/train.py")
exec(compile("def step():\n    dist.all_reduce(torch.ones(2))\nstep()\n", name, "exec"), {"dist": dist, "torch": torch})
folder = fr_backend.dump("non-UTF-8 caller")
filenames = [f["filename"] for p in sorted(glob.glob(os.path.join(folder, "*", "*")))
             for e in load_dump(p)["entries"] for f in e["frames"]]
print("RESULT " + json.dumps({"rank": RANK, "filenames": filenames}), flush=True)
dist.destroy_process_group()
