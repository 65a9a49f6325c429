"""Defect 4: the flight recorder analyzer's read_dump takes rank and hostname
from the file name even when the dump says which rank/host wrote it (patch 0004)."""

import pickle
import textwrap

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchpatch_support as S  # noqa: E402

LOADER = "torch/distributed/flight_recorder/components/loader.py"
FR_TRACE = "torch.distributed.flight_recorder.fr_trace"


def _entry(rank):
    return {
        "record_id": 0, "pg_id": 0, "process_group": ("0", "default_pg"),
        "collective_seq_id": 1, "p2p_seq_id": 0, "op_id": 1,
        "profiling_name": "nccl:all_reduce", "time_created_ns": 1000 + rank,
        "input_sizes": [[4]], "input_dtypes": ["Float"],
        "output_sizes": [[4]], "output_dtypes": ["Float"],
        "state": "completed", "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None, "retired": True,
        "timeout_ms": 600000, "is_p2p": False, "frames": [],
        "thread_id": "1", "thread_name": "main",
    }


def _dump(rank, header=True):
    d = {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {"0": {"last_enqueued_collective": 1, "last_started_collective": 1,
                            "last_completed_collective": 1}},
        "entries": [_entry(rank)],
    }
    if header:
        d["rank"] = rank
        d["hostname"] = f"host{'AB'[rank]}"
    return d


def _write(folder, files):
    folder.mkdir()
    for name, dump in files.items():
        (folder / name).write_bytes(pickle.dumps(dump))
    return folder


def self_describing(tmp_path):
    # File names do not encode the writer's rank (7 and 9 for ranks 0 and 1).
    return _write(tmp_path / "sd", {"dump_rank_7": _dump(0), "dump_rank_9": _dump(1)})


_READ = textwrap.dedent(
    """
    import json, os, sys
    from torch.distributed.flight_recorder.components import loader
    d = sys.argv[1]
    out = {"loader_file": loader.__file__}
    for f in sorted(os.listdir(d)):
        r = loader.read_dump("dump_rank_", os.path.join(d, f))
        out[f] = [r["rank"], r["host_name"]]
    print("RESULT " + json.dumps(out))
    """
)


def _fr_trace(folder, out, env=None):
    return S.run_single(["-m", FR_TRACE, str(folder), "-o", str(out)], env=env)


def test_defect_loader_uses_file_name(tmp_path):
    folder = self_describing(tmp_path)
    r = _fr_trace(folder, tmp_path / "db.pkl")
    assert r.returncode != 0
    assert "Missing dump files from ranks {0, 1}" in r.stderr
    res = S._parse_result(S.run_single(["-c", _READ, str(folder)]).stdout)
    assert res["dump_rank_7"] == [7, "host_rank7"]


def test_patch_0004_fr_trace_uses_dump_header(tmp_path):
    folder = self_describing(tmp_path)
    root = S.apply_patches(["fr_loader"], tmp_path / "patched")
    env = S.override_env(root, [LOADER])
    out = tmp_path / "db.pkl"
    r = _fr_trace(folder, out, env=env)
    assert r.returncode == 0, r.stderr
    assert out.exists()
    # Inspect the produced database (unpickling needs torch's FR types).
    check = S.run_single(
        ["-c", "import pickle,sys,json; t,db=pickle.load(open(sys.argv[1],'rb'));"
         "print('RESULT '+json.dumps(sorted({m.global_rank for m in db.memberships})))",
         str(out)]
    )
    assert S._parse_result(check.stdout) == [0, 1]
    res = S._parse_result(S.run_single(["-c", _READ, str(folder)], env=env).stdout)
    assert res["loader_file"] == str(root / LOADER)
    assert res["dump_rank_7"] == [0, "hostA"]
    assert res["dump_rank_9"] == [1, "hostB"]


def test_patch_0004_falls_back_to_file_name(tmp_path):
    # Old-style dumps without the header keys are read exactly as before.
    folder = _write(tmp_path / "old", {"dump_rank_0": _dump(0, header=False),
                                       "dump_rank_1": _dump(1, header=False)})
    root = S.apply_patches(["fr_loader"], tmp_path / "patched")
    env = S.override_env(root, [LOADER])
    res = S._parse_result(S.run_single(["-c", _READ, str(folder)], env=env).stdout)
    assert res["loader_file"] == str(root / LOADER)
    assert res["dump_rank_0"] == [0, "host_rank0"]
    assert res["dump_rank_1"] == [1, "host_rank1"]
    r = _fr_trace(folder, tmp_path / "db.pkl", env=env)
    assert r.returncode == 0, r.stderr
