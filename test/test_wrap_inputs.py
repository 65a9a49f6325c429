"""fr_backend.wrap's public functions given bad input (workers/wrap_bad_inputs.py, one process per test).

wrap_backend and wrap_process_group raise a ValueError or TypeError of one line that names the argument at
fault, and start nothing (no frnccl thread after every bad call); wrap_process_group_or_warn never raises,
returns the group as the library built it and says one line on stderr. A wrapped backend let go without a
shutdown does not hang the next wrap (its last reference, dropped as the next life begins, detaches it).
"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dist_harness import run_ranks

WORKER = Path(__file__).resolve().parent / "workers" / "wrap_bad_inputs.py"
RUN_TIMEOUT_S = 60


def run_worker(mode: str, tmp_path: Path) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRNCCL_")}
    env.update(FRNCCL_DUMP_DIR=str(tmp_path / "dumps"), OMP_NUM_THREADS="1")
    try:
        done = subprocess.run([sys.executable, str(WORKER), mode], capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as err:
        said = (err.stdout or b"").decode(errors="replace")
        raise AssertionError(f"{mode}: still running after {RUN_TIMEOUT_S} s; it said:\n{said}") from None
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _said_right(case: dict[str, Any]) -> bool:
    if case["case"].startswith("or_warn_"):
        # Never raises; the group comes back as the library built it; one line on stderr.
        said = case["stderr"].splitlines()
        return (case["raised"] is None and case["returned_given"] and len(said) == 1
                and said[0].startswith("frnccl: ") and case["argument"] in said[0])
    message = case["message"]
    return (case["raised"] in ("ValueError", "TypeError") and "\n" not in message
            and message.startswith("frnccl: ") and case["argument"] in message and not case["stderr"])


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_bad_arguments_raise_one_line_naming_the_argument(tmp_path: Path) -> None:
    lines = run_worker("bad_inputs", tmp_path)
    cases = [line for line in lines if "case" in line]
    assert len(cases) > 20, lines
    wrong = [case for case in cases if not _said_right(case)]
    assert not wrong, "\n".join(map(str, wrong))
    threads = next(line["frnccl_threads"] for line in lines if "frnccl_threads" in line)
    assert threads == [], f"a bad call started frnccl's threads: {threads}"
    assert next(line["good"] for line in lines if "good" in line) == "frnccl", lines


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_backend_dropped_without_shutdown_does_not_hang_the_next_wrap(tmp_path: Path) -> None:
    lines = run_worker("drop_then_wrap", tmp_path)
    assert [line.get("rewrapped") for line in lines if "rewrapped" in line] == ["frnccl"], lines


def test_a_later_group_on_a_library_groups_slot_opens_its_incident(tmp_path: Path) -> None:
    """A group whose library handles its failures (handles_failures, as the torchft integration sets) opens no
    incident; a plain frnccl group of a later life that gets its recorder slot must. Before, the flag was kept
    by slot: the later group's timeout was recorded and nothing more (no dump, no verdict)."""
    dump_dir = tmp_path / "dumps"
    job = run_ranks("library_slot_reuse.py", 2, timeout=120, env={"FRNCCL_DUMP_DIR": str(dump_dir)})
    log = job.describe()
    job.assert_ok()
    assert "RAISED" in job.ranks[0].output and "DONE 1" in job.ranks[1].output, log
    incidents = [p.name for p in dump_dir.iterdir() if p.is_dir() and "-timeout-" in p.name] if dump_dir.is_dir() else []
    assert len(incidents) == 1, f"{incidents}\n{log}"
    assert re.search(r"^frnccl: verdict: not_joined: rank 1\b", job.ranks[0].output, re.M), log


def test_torchft_groups_of_a_multi_rank_replica_group_are_left_as_built(capsys: pytest.CaptureFixture[str]) -> None:
    """Each rank of a replica group of several ranks makes its own cross-replica group under one store host; frnccl
    keys a job by the store's root and the group's ranks, so it leaves those groups as torchft built them and says
    so once. Before, every such group was wrapped, two processes as the same replica rank in one key space."""
    from fr_backend.integrations import torchft as integration

    built = []

    def create_pg(self: Any, store: Any, rank: int, world_size: int) -> object:
        built.append(object())
        return built[-1]

    class Replica:  # the attributes torchft's ProcessGroupGloo sets in configure()
        _quorum_id, _group_rank, _group_world_size, _global_ranks, _timeout = 3, 1, 2, None, 10.0

    integration._said_not_wrapped = False
    wrapped = integration._wrapped(create_pg)
    first = wrapped(Replica(), None, 0, 2)
    second = wrapped(Replica(), None, 1, 2)
    assert first is built[0] and second is built[1]
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("frnccl:")]
    assert len(lines) == 1 and "replica group of 2 ranks" in lines[0], lines
