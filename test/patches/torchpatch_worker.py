"""Worker process for test/patches (one rank; 2 are started by the test).

usage: torchpatch_worker.py SCENARIO RANK WORLD_SIZE STORE_PORT

Prints one line ``RESULT <json>`` with what the test asserts on.  A tiny
pure-Python plugin backend is registered here (its creator returns a gloo
backend), so torch's plugin ("custom backend") code path is exercised without
the frnccl C++ extension.
"""

import datetime
import json
import pickle
import sys

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, ProcessGroupGloo

TIMEOUT = datetime.timedelta(seconds=30)
SEQ_CALLS = []


class RecordingGloo(ProcessGroupGloo):
    """Gloo backend that records whether c10d asked it to set its sequence number."""

    def _set_sequence_number_for_group(self):
        SEQ_CALLS.append(self.rank())
        return super()._set_sequence_number_for_group()


def gloo_creator(opts, backend_options):
    return ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)


def recording_creator(opts, backend_options):
    return RecordingGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)


def uid_copying_creator(opts, backend_options):
    """Python-side workaround for defect 3: the creator copies the group name
    (opts.group_id) to the backend it returns. torch binds no setGroupUid() for
    Backend, so go through a throw-away ProcessGroup, whose _set_group_name()
    calls setGroupUid() on every backend registered on it."""
    backend = ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    tmp = ProcessGroup(opts.store, opts.group_rank, opts.group_size)
    tmp._register_backend(torch.device("cpu"), ProcessGroup.BackendType.CUSTOM, backend)
    tmp._set_group_name(opts.group_id)
    return backend


def register(name, creator):
    dist.Backend.register_backend(name, creator, extended_api=True, devices=["cpu", "cuda"])


def init(backend, rank, world, port):
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=TIMEOUT)


def allreduce(group=None):
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    return t.item()


def c10d_file():
    return dist.distributed_c10d.__file__


def scenario_seqnum(rank, world, port):
    register("seqplug", recording_creator)
    init("seqplug", rank, world, port)
    result = {"seq_set_called": bool(SEQ_CALLS), "allreduce": allreduce()}
    return result


def scenario_fake(rank, world, port):
    # "fake" is a real plugin backend shipped with torch whose C++ backend does
    # NOT support sequence numbers: it must keep working with patch 0001.
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"name": dist.group.WORLD.name(), "ok": True}


def scenario_mixed(rank, world, port):
    register("plug", gloo_creator)
    init("cpu:gloo,cuda:plug", rank, world, port)
    world_name = dist.group.WORLD.name()
    allreduce()
    sub = dist.new_group([0, 1], backend="cpu:gloo")
    sub_name = sub.name()
    allreduce(sub)
    return {"mixed_name": world_name, "cpu_gloo_name": sub_name}


def fr_uids():
    dump = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    return [list(e["process_group"]) for e in dump["entries"] if e["profiling_name"] == "gloo:all_reduce"]


def scenario_detail(rank, world, port):
    # Started with TORCH_DISTRIBUTED_DEBUG=DETAIL and TORCH_FR_BUFFER_SIZE set.
    register("plug", gloo_creator)
    register("plugwa", uid_copying_creator)
    init("plug", rank, world, port)
    world_pg = dist.group.WORLD
    wa = dist.new_group([0, 1], backend="plugwa")
    dist.set_debug_level(dist.DebugLevel.OFF)  # control: not wrapped
    ctl = dist.new_group([0, 1], backend="plug")
    groups = {"world": world_pg, "workaround": wa, "control": ctl}
    out = {}
    for key, g in groups.items():
        allreduce(g)
        out[key] = {
            "group_name": g.group_name,
            "backend_type": type(g._get_backend(torch.device("cpu"))).__name__,
        }
    uids = fr_uids()
    for key, entry in zip(groups, uids):
        out[key]["fr_process_group"] = entry
    return out


def main():
    scenario, rank, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    result = globals()["scenario_" + scenario](rank, world, port)
    result["c10d_file"] = c10d_file()
    dist.destroy_process_group()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
