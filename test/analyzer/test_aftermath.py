"""Aftershocks (analyzer/aftermath.py): the shapes a timed-out rank's dump of the first incident takes.

2 ranks: rank 1 stalls, rank 0 times out in all_reduce seq 4 and dumps (incident E, both ranks' dumps); rank 1
wakes later, calls seq 4, fails on its peer's closed connection and dumps alone (local incident L). Rank 0's dump
of E shows seq 4 either failed (Gloo's own timeout raised first: retired without completing) or still open past
its group's timeout (frnccl's watchdog saw the deadline first and dumped before Gloo failed it; it aborts the
groups after the dump). Which one is a race of rank 0's threads (test_incidents.py's real job shows both, the
open one more often on a loaded machine); either way L follows from E.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from fr_backend import compact
from fr_backend.analyzer.report import run, to_json
from fr_backend.analyzer.synth import MS, Job

TIMEOUT_MS = 4000
FIRST = "20260101-000000.100-timeout-r0"
LATER = "20260101-000012.100-error-r1-local"
CULPRIT = 1


def _write(root: Path, incident: str, dump: dict[str, Any]) -> None:
    folder = root / incident / "compact"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"frnccl_rank_{dump['rank']}.json.gz").write_bytes(compact.encode(dump, level=1))


def _at(dump: dict[str, Any], when_ns: int, reason: str, trigger: int) -> dict[str, Any]:
    """The dump as written at ``when_ns`` for a ``reason`` incident, under a group timeout of TIMEOUT_MS."""
    shift = when_ns - dump["dump_time_ns"]
    dump["dump_time_ns"] = when_ns
    dump["clock"]["realtime_ns"] += shift
    dump["clock"]["monotonic_ns"] += shift
    dump.update(dump_reason=reason, dump_detail=f"synthetic {reason}", trigger_rank=trigger)
    for cfg in dump["pg_config"].values():
        cfg["timeout_ms"] = TIMEOUT_MS
    for e in dump["entries"]:
        e["timeout_ms"] = TIMEOUT_MS
    return dump


def _job(tmp_path: Path, first: str) -> Path:
    """Both incidents in one dump folder; ``first``: how rank 0's seq 4 looks in its dump of E."""
    j = Job(2)
    for _ in range(3):
        j.collective()
    j.collective(ranks=[0], state="started")  # rank 0 waits in seq 4; rank 1 stalls before it
    waiting = j.ranks[0].entries[-1]
    age_ms = TIMEOUT_MS // 2 if first == "before_deadline" else TIMEOUT_MS + 2  # the watchdog's poll past it
    dumped = waiting["time_created_ns"] + age_ms * MS
    if first == "failed":
        waiting["retired"] = True  # Gloo's timeout failed it before the dump
    root = tmp_path / "dumps"
    for r in (0, CULPRIT):
        _write(root, FIRST, _at(j.dump(r, incident=FIRST), dumped + r * MS, "timeout", 0))
    j.now = dumped + 10_000 * MS  # rank 1 wakes well after E and calls seq 4: it fails at once
    j.collective(ranks=[CULPRIT], state="started")
    j.ranks[CULPRIT].entries[-1]["retired"] = True
    _write(root, LATER, _at(j.dump(CULPRIT, incident=LATER), j.now + 5 * MS, "error", CULPRIT))
    return root


@pytest.mark.timeout(60)
@pytest.mark.parametrize("first", ["open_past_timeout", "failed"])
def test_later_incident_follows_a_timeout_whichever_way_the_dump_shows_it(tmp_path, first):
    root = _job(tmp_path, first)
    report = to_json(run([str(root)], jobs=1))
    faults = [f for f in report["findings"] if f["severity"] in ("fault", "suspect")]
    assert Path(report["source"]).name == FIRST, report
    assert faults[0]["kind"] == "not_joined" and faults[0]["culprit_ranks"] == [CULPRIT], report
    assert [os.path.basename(x["incident"]) for x in report["aftershocks"]] == [LATER], report
    assert "where rank 0's op of that group had failed" in report["aftershocks"][0]["why"], report


@pytest.mark.timeout(60)
def test_an_open_op_still_within_its_timeout_is_no_broken_group(tmp_path):
    """Refusal: rank 0 was inside seq 4 for half its timeout when E was dumped: nothing there shows the group
    broken, so L is analysed as the latest incident, on its own."""
    root = _job(tmp_path, "before_deadline")
    report = to_json(run([str(root)], jobs=1))
    assert Path(report["source"]).name == LATER and report["aftershocks"] == [], report
    assert report["findings"][0]["kind"] == "missing_dump" and report["findings"][0]["culprit_ranks"] == [0], report
