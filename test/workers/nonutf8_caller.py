"""One rank whose names are not valid UTF-8, then a dump with Python stacks in the formats
FRNCCL_DUMP_FORMATS names: its caller's source file is in a folder named in Latin-1 (os.fsdecode
gives a lone surrogate), and its thread's name holds bytes of no UTF-8 (an overlong "/", a lead
byte past U+10FFFF). Reports, per dump file, the frames' file names and thread names as the dump
holds them, or why it could not be read."""

from __future__ import annotations

import ctypes
import glob
import json
import os

# PR_SET_NAME (15), before the first op reads the name: "w" C0 AF (overlong "/") F5 80 80 80 "k"
ctypes.CDLL(None, use_errno=True).prctl(15, b"w\xc0\xaf\xf5\x80\x80\x80k", 0, 0, 0)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import fr_backend  # noqa: E402
from _worker import RANK, init  # noqa: E402
from fr_backend.analyzer.load import DumpError, load_dump  # noqa: E402

init("frnccl")
name = os.fsdecode(b"/data/caf\xe9/train.py")
exec(compile("def step():\n    dist.all_reduce(torch.ones(2))\nstep()\n", name, "exec"), {"dist": dist, "torch": torch})
folder = fr_backend.dump("non-UTF-8 names")
files = {}
for p in sorted(glob.glob(os.path.join(folder, "*", "*"))):
    try:
        entries = load_dump(p)["entries"]
        files[os.path.relpath(p, folder)] = {"filenames": [f["filename"] for e in entries for f in e["frames"]],
                                             "thread_names": sorted({e["thread_name"] for e in entries})}
    except DumpError as exc:
        files[os.path.relpath(p, folder)] = {"error": str(exc)}
print("RESULT " + json.dumps({"rank": RANK, "files": files}), flush=True)
dist.destroy_process_group()
