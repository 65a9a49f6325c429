"""FRNCCL_ENABLE=1 turns frnccl on for unmodified training scripts (workers/enable_*.py).

Every script runs twice over env:// with a real TCPStore, Gloo on CPU: once plain, once with FRNCCL_ENABLE=1.
What it prints (tensors, every backend name torch reports) must be the same; under FRNCCL_ENABLE the job,
sent the dump signal, leaves one coordinated dump with the script's ops in every rank's file.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fr_backend
from dist_harness import Job, JobThread, run_ranks, wait_for

DUMP_TIMEOUT_S = 30
JOB_TIMEOUT_S = 240
# Lines that differ from run to run by nature (timing), or that only one of the two runs prints by design.
NOT_COMPARED = re.compile(r"^(DONE_MONO |frnccl: )")


def base_env() -> dict[str, str]:
    """The test process's environment, with torch's entry points on and no FRNCCL_* setting of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRNCCL_")}
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"
    return env


def outputs(job: Job) -> dict[int, list[str]]:
    """Each rank's OUT lines, in order."""
    return {r.rank: [ln for ln in r.output.splitlines() if ln.startswith("OUT ")] for r in job.ranks}


# torch's own Gloo workers can abort a plain process as the interpreter finalizes, after the script's last
# line (workers/plain_script.py says more): a known torch problem, not an outcome to compare.
GLOO_EXIT_ABORT = "terminate called without an active exception"


def run_script(script: str, world: int, args: list[str], env: dict[str, str], plain: bool = True) -> Job:
    job = run_ranks(script, world, *args, timeout=JOB_TIMEOUT_S, env={**base_env(), **env})
    for r in job.ranks:
        if plain and r.returncode == -signal.SIGABRT and r.done_mono() is not None and GLOO_EXIT_ABORT in r.output:
            r.returncode = 0
    return job.assert_ok()


def incident_files(dump_dir: Path, world: int) -> list[Path] | None:
    """Every rank's file of the one incident folder in dump_dir, once all are written."""
    folders = sorted(p for p in dump_dir.iterdir() if p.is_dir()) if dump_dir.is_dir() else []
    if len(folders) != 1:
        return None
    files = [folders[0] / "compact" / f"frnccl_rank_{r}.json.gz" for r in range(world)]
    return files if all(f.exists() for f in files) else None


def run_enabled_with_dump(script: str, world: int, args: list[str], env: dict[str, str], dump_dir: Path,
                          tmp_path: Path) -> tuple[Job, list[dict[str, Any]]]:
    """The script under FRNCCL_ENABLE=1; once every rank holds, one rank gets SIGUSR1 and the whole job dumps."""
    hold = tmp_path / "hold"
    hold.mkdir()
    full_env = {**base_env(), **env, "FRNCCL_ENABLE": "1", "HOLD_DIR": str(hold),
                "FRNCCL_DUMP_TIMEOUT_SEC": str(DUMP_TIMEOUT_S)}
    bg = JobThread(lambda: run_ranks(script, world, *args, timeout=JOB_TIMEOUT_S, env=full_env))
    try:
        wait_for(lambda: all((hold / f"pid_{r}").exists() for r in range(world)), JOB_TIMEOUT_S,
                 "every rank to finish its work", bg)
        os.kill(int((hold / "pid_1").read_text()), signal.SIGUSR1)
        wait_for(lambda: incident_files(dump_dir, world) is not None, DUMP_TIMEOUT_S * 2, "every rank's dump", bg)
    finally:
        (hold / "stop").write_text("1")
    job = bg.finish(JOB_TIMEOUT_S).assert_ok()
    files = incident_files(dump_dir, world)
    assert files is not None, job.describe()
    return job, [fr_backend.load_dump(str(f)) for f in files]


def op_names(dump: dict[str, Any]) -> list[str]:
    return [str(e["profiling_name"]) for e in dump["entries"]]


def check_same_and_dumped(tmp_path: Path, script: str, world: int, args: list[str], ops: dict[str, int],
                          env: dict[str, str] | None = None, dump_dir: Path | None = None) -> dict[int, list[str]]:
    """Runs `script` plain and enabled; the OUT lines must match, and every rank's dump must hold at least
    `ops[name]` entries whose name ends with each op name."""
    env = env or {}
    plain = run_script(script, world, args, env)
    if dump_dir is None:
        dump_dir = tmp_path / "dumps"
        env = {**env, "FRNCCL_DUMP_DIR": str(dump_dir)}
    enabled, dumps = run_enabled_with_dump(script, world, args, env, dump_dir, tmp_path)
    want, got = outputs(plain), outputs(enabled)
    assert all(want.values()), plain.describe()
    assert got == want, f"plain:\n{plain.describe()}\nFRNCCL_ENABLE=1:\n{enabled.describe()}"
    for rank, dump in enumerate(dumps):
        assert dump["rank"] == rank and dump["dump_reason"] == "signal", (rank, dump["rank"], dump["dump_reason"])
        names = op_names(dump)
        for op, count in ops.items():
            seen = sum(n.endswith(op) for n in names)
            assert seen >= count, f"rank {rank}: {seen} {op} entries, want {count}: {names}\n{enabled.describe()}"
    # The plain run never loaded frnccl's groups: nothing of frnccl was printed there.
    assert "frnccl" not in "".join(r.output for r in plain.ranks), plain.describe()
    return got


# "cpu:gloo,cuda:nccl" cannot start on a torch without NCCL, plain or not: test_nccl_names_without_nccl_ops.
@pytest.mark.parametrize("spec", ["gloo", "none", "cpu:gloo"])
def test_torchrun_style(tmp_path: Path, spec: str) -> None:
    got = check_same_and_dumped(tmp_path, "enable_torchrun.py", 4, [spec],
                                {"all_reduce": 2, "broadcast": 1})  # its own and DDP's
    assert not [ln for lines in got.values() for ln in lines if "frnccl" in ln or "custom" in ln], got


def test_titan_style_mesh_takes_torch_recorder_settings(tmp_path: Path) -> None:
    """init_device_mesh("cpu", (2, 2)); the script sets TORCH_FR_DUMP_TEMP_FILE=<folder>/rank_ as torchtitan
    does, and with FRNCCL_DUMP_DIR unset frnccl dumps into that folder."""
    traces = tmp_path / "traces"
    traces.mkdir()
    got = check_same_and_dumped(tmp_path, "enable_titan.py", 4, [str(traces)], {"all_reduce": 2, "all_gather": 1},
                                dump_dir=traces)
    assert "OUT 0 dp_ranks=[0, 2]" in got[0] and "OUT 0 tp_ranks=[0, 1]" in got[0], got[0]


def test_megatron_style_new_groups(tmp_path: Path) -> None:
    check_same_and_dumped(tmp_path, "enable_megatron.py", 4, ["2"], {"all_reduce": 2})


def test_accelerate_style_no_backend_new_subgroups(tmp_path: Path) -> None:
    check_same_and_dumped(tmp_path, "enable_accelerate.py", 4, ["2"], {"all_reduce": 1})


def torch_state(value: str | None) -> subprocess.CompletedProcess[str]:
    """A fresh `import torch` with FRNCCL_ENABLE=value: prints whether torch's functions are its own."""
    env = base_env()
    env.pop("FRNCCL_ENABLE", None)
    if value is not None:
        env["FRNCCL_ENABLE"] = value
    code = (
        "import torch, torch.distributed as dist\n"
        "from torch.distributed import distributed_c10d as c10d\n"
        "fns = [c10d._new_process_group_helper, getattr(c10d, 'split_group', None), dist.new_group,\n"
        "       dist.init_process_group, getattr(dist, 'split_group', None)]\n"
        "import os\n"
        "home = os.path.dirname(torch.__file__) + os.sep  # torch's own decorators wrap some of them\n"
        "own = all(f is None or f.__code__.co_filename.startswith(home) for f in fns)\n"
        "print('OWN', own, 'frnccl' in dist.Backend.backend_list)\n"
    )
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("value", [None, "0", ""])
def test_unset_or_0_replaces_nothing(value: str | None) -> None:
    done = torch_state(value)
    assert done.returncode == 0 and done.stdout.strip() == "OWN True True", (done.stdout, done.stderr)
    assert "frnccl" not in done.stderr, done.stderr


@pytest.mark.parametrize("value", ["yes please", "2"])
def test_bad_value_is_one_line_and_replaces_nothing(value: str) -> None:
    done = torch_state(value)
    assert done.returncode == 0 and done.stdout.strip() == "OWN True True", (done.stdout, done.stderr)
    lines = [ln for ln in done.stderr.splitlines() if "frnccl" in ln]
    assert len(lines) == 1 and "FRNCCL_ENABLE" in lines[0] and repr(value) in lines[0], done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_enabled_replaces_the_helper() -> None:
    done = torch_state("1")
    assert done.returncode == 0 and done.stdout.strip() == "OWN False True", (done.stdout, done.stderr)
    assert done.stderr.strip() == "", done.stderr


def test_bad_value_job_runs_as_plain(tmp_path: Path) -> None:
    plain = run_script("enable_torchrun.py", 2, ["gloo"], {})
    bad = run_script("enable_torchrun.py", 2, ["gloo"], {"FRNCCL_ENABLE": "2"})  # plain gloo, as if unset
    assert outputs(bad) == outputs(plain), bad.describe()
    for r in bad.ranks:
        lines = [ln for ln in r.output.splitlines() if "frnccl" in ln]
        assert len(lines) == 1 and "FRNCCL_ENABLE" in lines[0] and "'2'" in lines[0], r.output


def test_nccl_names_without_nccl_ops() -> None:
    """The "nccl" mapping, checked without running NCCL: a one-rank group over a HashStore, made through the
    enabled helper with backend "nccl" and with the mixed spec, reports the names plain torch reports."""
    code = r"""
import torch, torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from datetime import timedelta
c10d.is_nccl_available = lambda: True  # the names only: no NCCL op runs
store = dist.HashStore()
dist.init_process_group("cpu:gloo", store=store, rank=0, world_size=1)
for spec in ("nccl", "cpu:gloo,cuda:nccl"):
    pg, _ = c10d._new_process_group_helper(1, 0, [0], spec, store, c10d._process_group_name([0], True),
                                            timeout=timedelta(seconds=60))
    cuda = pg._get_backend(torch.device("cuda"))
    print(spec, "|", c10d.get_backend(pg), pg._get_backend_name(), c10d._world.pg_backend_config[pg],
          sorted(str(d) for d in pg._device_types), cuda.name())
"""
    env = {**base_env(), "FRNCCL_ENABLE": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines == [
        "nccl | nccl nccl cuda:nccl ['cuda'] frnccl",
        "cpu:gloo,cuda:nccl | cpu:gloo,cuda:nccl nccl cpu:gloo,cuda:nccl ['cpu', 'cuda'] frnccl",
    ], done.stdout + done.stderr


def test_config_shows_torch_sources(tmp_path: Path) -> None:
    env = {**base_env(), "FRNCCL_ENABLE": "1", "TORCH_FR_BUFFER_SIZE": "1234",
           "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr" / "rank_")}
    done = subprocess.run([sys.executable, "-m", "fr_backend.cli", "config"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FRNCCL_BUFFER_SIZE=1234 (from TORCH_FR_BUFFER_SIZE)" in done.stdout, done.stdout
    assert f"FRNCCL_DUMP_DIR={tmp_path / 'fr'} (from TORCH_FR_DUMP_TEMP_FILE)" in done.stdout, done.stdout
    bad = subprocess.run([sys.executable, "-m", "fr_backend.cli", "config"],
                         env={**env, "TORCH_FR_BUFFER_SIZE": "lots"}, capture_output=True, text=True, timeout=120)
    assert "FRNCCL_BUFFER_SIZE=(default" in bad.stdout, bad.stdout
    lines = [ln for ln in bad.stderr.splitlines() if "TORCH_FR_BUFFER_SIZE" in ln]
    assert len(lines) == 1 and "'lots'" in lines[0], bad.stderr
