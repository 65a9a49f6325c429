"""What torch's own NCCL flight recorder holds when frnccl and plain nccl groups share a process.

FRNCCL_TEST_ORDER picks the order in which the groups are created:
- frnccl_first: the default group is frnccl, a plain nccl group comes after it;
- plain_first: the default group is plain nccl (no op yet), an frnccl group comes after it.
Each group then runs OPS all_reduces. The notes give torch's entries by group name, for the test to judge
against docs/configuration.md.
"""

from __future__ import annotations

import os
import pickle

# This job is about frnccl's default, which only holds when the user did not size torch's recorder.
for key in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
    os.environ.pop(key, None)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from _worker import Checks, finish, init  # noqa: E402

LOCAL = int(os.environ["LOCAL_RANK"])
ORDER = os.environ["FRNCCL_TEST_ORDER"]
OPS = 3
torch.cuda.set_device(LOCAL)

if ORDER == "frnccl_first":
    init("frnccl")
    FR, PLAIN = dist.group.WORLD, dist.new_group(backend="nccl")
elif ORDER == "plain_first":
    init("nccl")
    PLAIN, FR = dist.group.WORLD, dist.new_group(backend="frnccl")
else:
    raise SystemExit(f"FRNCCL_TEST_ORDER={ORDER!r}: expected frnccl_first or plain_first")

checks = Checks()
for group in (PLAIN, FR):
    for _ in range(OPS):
        t = torch.ones(8, device="cuda")
        dist.all_reduce(t, group=group)
        checks.expect("all_reduce", t[0].item() == dist.get_world_size(), f"got {t[0].item()}")
torch.cuda.synchronize()

entries: dict[str, int] = {}
for entry in pickle.loads(torch._C._distributed_c10d._dump_nccl_trace()).get("entries", []):
    name = str(entry.get("process_group", ("?",))[0])
    entries[name] = entries.get(name, 0) + 1
checks.notes.update(
    torch_recorder_entries=entries,
    frnccl_group=dist.distributed_c10d._get_process_group_name(FR),
    plain_group=dist.distributed_c10d._get_process_group_name(PLAIN),
    ops=OPS,
)
finish(checks)
