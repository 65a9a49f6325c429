"""torch's own flight recorder and frnccl in one process (docs/configuration.md, "Inner Gloo and NCCL groups").

frnccl records every op itself, so its inner NCCL group must not be recorded by torch's recorder too, and a
plain nccl group the user created first must keep torch's recorder. Needs 2 GPUs; skipped otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dist_harness import run_ranks  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
RANKS = min(GPUS, 2)  # one per GPU


def torch_entries(order: str, tmp_path: Path) -> list[tuple[int, dict[str, int], dict]]:
    """(rank, torch's entries for each of the two groups, notes) of one job."""
    job = run_ranks("gpu_torch_recorder.py", RANKS, timeout=120,
                    env={"FRNCCL_TEST_ORDER": order, "FRNCCL_DUMP_DIR": str(tmp_path / "dumps")})
    job.assert_ok()
    out = []
    for r in job.results():
        assert not r["failures"], r["failures"]
        assert len(r["matched"]) == 2 * r["notes"]["ops"], r["matched"]
        notes = r["notes"]
        held = notes["torch_recorder_entries"]
        out.append((r["rank"], {"frnccl": held.get(notes["frnccl_group"], 0), "plain": held.get(notes["plain_group"], 0)},
                    notes))
    return out


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA device")
def test_frnccl_first_keeps_torch_recorder_off(tmp_path):
    """frnccl's group first: nothing is recorded twice. The legacy NCCL recorder is a process-wide singleton
    sized once, so it stays off for the plain group too; torch 2.15 records a plain nccl2 group through a
    hook of its own, which frnccl's group never gets."""
    for rank, held, notes in torch_entries("frnccl_first", tmp_path):
        plain = 0 if notes["inner_nccl_records_itself"] else notes["ops"]
        assert held == {"frnccl": 0, "plain": plain}, f"rank {rank}: torch's recorder holds {notes}"


@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA device")
def test_plain_nccl_first_keeps_torch_recorder_on(tmp_path):
    """A plain nccl group first: torch's recorder stays on for it. The legacy backend then records frnccl's
    inner group too (its ops twice); nccl2's hook records only the group it is attached to."""
    for rank, held, notes in torch_entries("plain_first", tmp_path):
        ops = notes["ops"]
        frnccl = ops if notes["inner_nccl_records_itself"] else 0
        assert held == {"frnccl": frnccl, "plain": ops}, f"rank {rank}: torch's recorder holds {notes}"
