"""A live rank summary (fr_backend._C.rank_summary, what `frnccl status` reuses) on a job with more groups than a
summary lists, with long group descriptions: prints RESULT {"summary": <json text>, "groups": <frnccl groups>}."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import fr_backend  # noqa: F401  (registers the backend)
from _worker import init
from fr_backend._native import native

GROUPS = 12  # more than a summary lists (8), each with a description far longer than it keeps


def main() -> int:
    init("frnccl")
    t = torch.ones(4)
    dist.all_reduce(t)
    groups = [dist.new_group(group_desc="x" * 300 + f"-{i}") for i in range(GROUPS)]
    for g in groups:
        dist.all_reduce(t, group=g)
    print("RESULT " + json.dumps({"summary": native().rank_summary(), "groups": GROUPS + 1}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
