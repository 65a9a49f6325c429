"""frnccl over whichever NCCL backend torch's "nccl" builds (nccl2 from torch 2.15, else the legacy
ProcessGroupNCCL), one rank on one GPU: healthy ops, a hang that frnccl's watchdog must catch, and the NCCL
library that torch happens to load being older than the one torch was built with.

The legacy case sets TORCH_DIST_USE_NCCL2=0; before torch 2.15 both cases run the legacy backend.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dist_harness import run_ranks  # noqa: E402
from fr_backend.analyzer.load import load_dump  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
HAS_NCCL2 = hasattr(torch._C._distributed_c10d, "ProcessGroupNCCL2") if torch.distributed.is_available() else False
needs_one = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA device")
GROUP_TIMEOUT = 10
INNER = {"default": {}, "legacy": {"TORCH_DIST_USE_NCCL2": "0"}}


def _expected_inner(case: str) -> str:
    return "ProcessGroupNCCL2" if HAS_NCCL2 and case == "default" else "ProcessGroupNCCL"


def _loaded_nccl() -> ctypes.CDLL | None:
    """The libnccl.so.2 this process's torch loaded (never a second copy), or None if torch has NCCL inside."""
    try:
        return ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None


def _lines(job, prefix: str) -> list[str]:
    return [ln[len(prefix):] for r in job.ranks for ln in r.output.splitlines() if ln.startswith(prefix)]


@needs_one
@pytest.mark.parametrize("case", sorted(INNER))
def test_healthy_ops_and_nccl_functions_the_loaded_nccl_may_lack(tmp_path, case):
    """memory_stats, suspend and resume each reach one NCCL function in torch's backend. Where the loaded libnccl
    lacks it (torch 2.15's wheel against NCCL 2.28), calling it ends the process with a symbol lookup error;
    frnccl refuses such a call with a one-line error instead, and forwards it where the function is there."""
    job = run_ranks("gpu_inner_nccl.py", 1, timeout=120,
                    env={**INNER[case], "SCENARIO": "healthy", "FRNCCL_DUMP_DIR": str(tmp_path / "dumps")})
    job.assert_ok()
    assert _lines(job, "INNER ")[0].split()[0] == _expected_inner(case), job.describe()
    assert _lines(job, "OPS ") == ["ok"], job.describe()
    if not hasattr(torch._C._distributed_c10d.Backend, "memory_stats"):
        return  # torch 2.11/2.12: no such Backend calls
    nccl = _loaded_nccl()
    api = {ln.split()[0]: ln.split(maxsplit=1)[1] for ln in _lines(job, "API ")}
    assert sorted(api) == ["memory_stats", "resume", "suspend"], job.describe()
    for name, function in (("memory_stats", "ncclCommMemStats"), ("suspend", "ncclCommSuspend"),
                           ("resume", "ncclCommResume")):
        if nccl is not None and not hasattr(nccl, function):
            assert api[name].startswith(f"refused frnccl: {name} needs {function}, which the loaded NCCL "), api
            assert "lacks" in api[name], api
        else:
            assert "lacks" not in api[name], api  # forwarded: NCCL's own answer, whatever it is


@needs_one
@pytest.mark.parametrize("case", sorted(INNER))
def test_hang_behind_a_gpu_kernel_is_dumped_and_ends(tmp_path, case):
    """A kernel that outlasts the group's timeout ahead of an all_reduce: frnccl's watchdog (not NCCL's, whose
    timeout frnccl moves past its own dump) fires, the dump is written and read, the verdict and the waiting
    thread's stack are printed, and the process ends well before the kernel would have let it."""
    dump_dir = tmp_path / "dumps"
    start = time.monotonic()
    job = run_ranks("gpu_inner_nccl.py", 1, timeout=GROUP_TIMEOUT + 90,
                    env={**INNER[case], "SCENARIO": "hang", "FRNCCL_DUMP_DIR": str(dump_dir),
                         "GROUP_TIMEOUT_SEC": str(GROUP_TIMEOUT), "FRNCCL_DUMP_TIMEOUT_SEC": "20"})
    elapsed = time.monotonic() - start
    job.assert_ok()
    out = job.ranks[0].output
    print(job.describe())  # the record of what the log showed, for the GPU runner's results
    assert "1/1 ranks wrote" in out, job.describe()
    assert "frnccl: verdict:" in out, job.describe()
    assert "OUTCOME next call raised DistBackendError: frnccl: timeout on pg 0" in out, job.describe()
    assert elapsed < GROUP_TIMEOUT + 12 + 30, job.describe()  # timeout + the kernel's rest + start-up
    incidents = [d for d in dump_dir.iterdir() if d.is_dir()]
    assert len(incidents) == 1, incidents
    files = sorted((incidents[0] / "compact").iterdir())
    assert len(files) == 1, files
    dump = load_dump(str(files[0]))
    assert dump["dump_reason"] == "timeout"
    last = dump["entries"][-1]
    assert last["profiling_name"] == "nccl:all_reduce" and last["state"] != "completed", last
    backends = {c.get("backend") for c in dump["pg_config"].values()}
    want = "gloo,nccl2" if _expected_inner(case) == "ProcessGroupNCCL2" else "gloo,nccl"
    assert backends == {want}, dump["pg_config"]
    assert "wait_behind_gpu_kernel" in dump["thread_stacks"], dump["thread_stacks"]
    assert dump["nccl_version"], "CUDA build must report the NCCL version"
    read = subprocess.run([sys.executable, "-m", "fr_backend.cli", "analyze", str(dump_dir), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert read.returncode in (0, 1), read.stderr
    report = json.loads(read.stdout)
    print("analyze:", json.dumps(report.get("findings", [])[:1])[:600])


@needs_one
def test_extension_calls_no_nccl_function_the_loaded_nccl_lacks():
    """frnccl's own library binds NCCL functions lazily too: each one it imports must be in the loaded libnccl."""
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    from fr_backend._native import native

    lib = native().__file__
    nccl = _loaded_nccl()
    out = subprocess.run(["nm", "-D", "--undefined-only", lib], capture_output=True, text=True, check=True).stdout
    imported = sorted({ln.split()[-1].split("@")[0] for ln in out.splitlines()
                       if ln.split() and ln.split()[-1].startswith("nccl")})
    if nccl is None:
        assert not imported, imported
        return
    assert [f for f in imported if not hasattr(nccl, f)] == [], imported
