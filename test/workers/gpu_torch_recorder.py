"""What torch's own NCCL flight recorder holds when frnccl and plain nccl groups share a process.

FRNCCL_TEST_ORDER picks the order in which the groups are created:
- frnccl_first: the default group is frnccl, a plain nccl group comes after it;
- plain_first: the default group is plain nccl (no op yet), an frnccl group comes after it.
Each group then runs OPS all_reduces. The notes give torch's entries by group name, and whether torch's
"nccl" records itself (the legacy ProcessGroupNCCL) or is recorded by torch's hook (nccl2), for the test to
judge against docs/configuration.md.
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


def _recorder_entries() -> list[dict]:
    """Every entry of torch's NCCL recorders: the legacy backend's own (entries "nccl:<op>"), and on torch
    2.15 the hook recorder that torch attaches to groups of ProcessGroupNCCL2, kept under its backend's name
    (entries "nccl2:<op>"). Each is read from its own recorder only, so nothing is counted twice."""
    c10d = torch._C._distributed_c10d
    found = [e for e in pickle.loads(c10d._dump_nccl_trace()).get("entries", [])
             if str(e.get("profiling_name", "")).startswith("nccl:")]
    if getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None) is not None:  # recorders by backend: 2.15
        found += [e for e in pickle.loads(c10d._dump_fr_trace(True, False, False, backend="nccl2")).get("entries", [])
                  if str(e.get("profiling_name", "")).startswith("nccl2:")]
    return found


entries: dict[str, int] = {}
for entry in _recorder_entries():
    name = str(entry.get("process_group", ("?",))[0])
    entries[name] = entries.get(name, 0) + 1
# torch 2.15 says which of its backends record themselves; "nccl" leaves that set when it builds nccl2,
# whose groups torch records through a hook on the group (frnccl's group declares itself self-recording).
self_recording = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
checks.notes.update(
    inner_nccl_records_itself=self_recording is None or "nccl" in self_recording,
    torch_recorder_entries=entries,
    frnccl_group=dist.distributed_c10d._get_process_group_name(FR),
    plain_group=dist.distributed_c10d._get_process_group_name(PLAIN),
    ops=OPS,
)
finish(checks)
