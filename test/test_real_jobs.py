"""The analyzer's verdict on real jobs: 4 ranks under torchrun (workers/real_jobs.py), one job per shape, each
judged by `frnccl analyze --json` as a user would run it on the job's dump folder.

- a rank SIGKILLed mid-training: torchrun stops the others with SIGTERM, and each of them must have dumped
  (FRNCCL_DUMP_ON_TERMINATE_MS); only the dead rank is named;
- a 2x2 mesh where one rank skips its TP all_reduce in one step and goes on;
- pipeline pairs where one receiver hangs in compute after its sender's isend;
- a healthy job whose dumps are shifted per host by clock offsets of +-5 ms, as a multi-host job's would be;
- two independent faults at once (a rank hangs in compute, another skips its pair's all_reduce): both named;
- healthy jobs with slow ranks, dumped on request mid-run (SIGUSR1) or at teardown: exit 0, and the slow rank named
  once as the straggler of the group where it is late itself; two equally late ranks together or not at all.

A faulty job must name exactly its culprit in the first finding, and no innocent rank in any fault or
straggler finding; a healthy one must exit 0 with no fault finding. Each job is bounded (group timeout 3 s,
dump deadline 3 s) so that the set costs CI about two and a half minutes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import fr_backend
from dist_harness import WORKERS, Job, _env, free_port, run_commands
from verdict_lines import check_agreement

sys.path.insert(0, str(WORKERS))
import real_jobs  # noqa: E402  (the culprits the jobs use)

WORLD = 4
PG_TIMEOUT_S = 3
DUMP_TIMEOUT_S = 3
JOB_BOUND_S = 90  # start-up of 5 Python processes on 2 loaded cores, the fault, the dumps
FAULT_SEVERITIES = ("fault", "suspect")


def torchrun(shape: str, dump_dir: Path, **extra: str) -> Job:
    """torchrun of workers/real_jobs.py SHAPE on WORLD ranks; the Job's one 'rank' is torchrun's output."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0",
        str(WORKERS / "real_jobs.py"), shape,
    ]
    env = _env(0, 1, 0, {
        "FRNCCL_DUMP_DIR": str(dump_dir),
        "FRNCCL_DUMP_TIMEOUT_SEC": str(DUMP_TIMEOUT_S),
        "REAL_JOB_PG_TIMEOUT": str(PG_TIMEOUT_S),
        **extra,
    })
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(key)  # torchrun sets them per rank
    job = run_commands([cmd], [env], JOB_BOUND_S)
    assert not job.timed_out, f"the job outlived its bound\n{job.describe()}"
    return job


def analyze(path: Path, log: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run([sys.executable, "-m", "fr_backend.cli", "analyze", str(path), "--json"],
                          capture_output=True, text=True, timeout=60)
    try:
        return proc.returncode, json.loads(proc.stdout), proc.stdout + proc.stderr
    except json.JSONDecodeError:
        pytest.fail(f"frnccl analyze --json printed no JSON (rc {proc.returncode}):\n{proc.stdout}{proc.stderr}\n"
                    f"{log}", pytrace=False)


def blamed(finding: dict[str, Any]) -> set[int]:
    return set(finding["culprit_ranks"])


def check_names_only(culprit: int, report: dict[str, Any], raw: str) -> None:
    """The first finding names exactly the culprit; no fault or straggler finding names an innocent rank."""
    findings = report["findings"]
    assert findings, f"no finding at all\n{raw}"
    first = findings[0]
    assert first["severity"] in FAULT_SEVERITIES and first["culprit_ranks"] == [culprit], (
        f"the first finding must name rank {culprit} alone, not {first['kind']} {first['culprit_ranks']}\n{raw}")
    for f in findings:
        if f["severity"] in FAULT_SEVERITIES or f["kind"] == "straggler":
            innocent = blamed(f) - {culprit}
            assert not innocent, f"{f['kind']} names innocent rank(s) {sorted(innocent)}\n{raw}"


# ----------------------------------------------------------------------------- a rank dies


def test_killed_rank_is_the_only_one_named(tmp_path):
    """Rank KILLED is SIGKILLed at step KILL_STEP of a DDP job; torchrun SIGTERMs the survivors 50-100 ms later,
    before the job-wide request of the survivors' failure reached every one of them. Each survivor dumps anyway
    (a late one on SIGTERM, into the same incident), and the analyzer names the dead rank alone."""
    dump_dir = tmp_path / "dumps"
    job = torchrun("kill", dump_dir)
    log = job.describe()
    assert f"KILLING {real_jobs.KILLED} at step {real_jobs.KILL_STEP}" in log, log
    rc, report, raw = analyze(dump_dir, log)
    assert rc == 1, raw + log
    survivors = [r for r in range(WORLD) if r != real_jobs.KILLED]
    assert report["ranks_missing"] == [real_jobs.KILLED], f"every survivor must have dumped\n{raw}\n{log}"
    assert report["ranks_found"] == survivors, raw
    check_names_only(real_jobs.KILLED, report, raw + log)
    # torchrun stops the survivors before a trigger's wait ends: a verdict, if one is printed, must agree, decided.
    check_agreement(log, report, verdict_optional=True)
    first = report["findings"][0]
    assert first["kind"] == "missing_dump", raw
    # The evidence tells the survivors the launcher stopped (dumped on SIGTERM) from the rank that never dumped.
    evidence = "\n".join(first["evidence"])
    assert f"rank {real_jobs.KILLED}: no dump at all" in evidence, raw
    on_sigterm = {d["rank"] for d in map(fr_backend.load_dump, dump_dir.glob("*/compact/frnccl_rank_*"))
                  if d["dump_reason"] == "sigterm"}
    for r in sorted(on_sigterm):
        assert re.search(rf"rank {r} dumped when SIGTERM reached it \(SIGTERM from pid \d+", evidence), raw


# ----------------------------------------------------------------------------- the program order broken


def test_mesh_rank_skips_tp_all_reduce_and_goes_on(tmp_path):
    """Rank SKIPPER skips its TP all_reduce in one step and goes on: its DP all_reduce completes, it waits in the
    world all_reduce, its TP peer waits in TP, the other DP group waits in DP: every rank waits on someone."""
    dump_dir = tmp_path / "dumps"
    job = torchrun("skip", dump_dir)
    rc, report, raw = analyze(dump_dir, job.describe())
    assert rc == 1, raw
    check_names_only(real_jobs.SKIPPER, report, raw)
    assert report["findings"][0]["kind"] == "not_joined", raw
    # Every rank waits on someone: only the program order (the dumps) tells the skipper; the summaries cannot,
    # so the verdict may be undecided (never naming another rank).
    check_agreement(job.describe(), report, undecided_ok=True)


def test_pipeline_receiver_hangs_after_isend(tmp_path):
    """Receiver HANGER hangs in compute before its recv; its sender posted an isend and waits in the world
    all_reduce. The receiver is the culprit: not a deadlock, not the sender."""
    dump_dir = tmp_path / "dumps"
    job = torchrun("pipeline", dump_dir)
    rc, report, raw = analyze(dump_dir, job.describe())
    assert rc == 1, raw
    check_names_only(real_jobs.HANGER, report, raw)
    check_agreement(job.describe(), report)


# ----------------------------------------------------------------------------- host clocks


# rank -> (host, clock offset in ns) of the dumps' writers
CLOCKS = {
    "same_host": {r: ("host0", 0) for r in range(WORLD)},
    "two_hosts": {0: ("hostA", 5_000_000), 1: ("hostA", 5_000_000), 2: ("hostB", -5_000_000), 3: ("hostB", -5_000_000)},
    "four_hosts": {0: ("host0", 5_000_000), 1: ("host1", -5_000_000), 2: ("host2", -5_000_000), 3: ("host3", 5_000_000)},
}
UNSHIFTED_NS_KEYS = ("monotonic_ns", "store_offset_ns")


def shifted(value: Any, offset_ns: int) -> Any:
    """Every wall-clock *_ns timestamp in a dump moved by offset_ns (0 stays 'unknown')."""
    if isinstance(value, dict):
        return {k: (v + offset_ns if k.endswith("_ns") and k not in UNSHIFTED_NS_KEYS and type(v) is int and v > 0
                    else shifted(v, offset_ns)) for k, v in value.items()}
    if isinstance(value, list):
        return [shifted(v, offset_ns) for v in value]
    return value


def rewrite_clocks(src: Path, dst: Path, clocks: dict[int, tuple[str, int]]) -> None:
    """A copy of the dump folder as hosts with these clocks would have written it (JSON only)."""
    for incident in sorted(p for p in src.iterdir() if p.is_dir()):
        for f in sorted((incident / "compact").iterdir()):
            d = fr_backend.load_dump(str(f))
            host, offset = clocks[d["rank"]]
            d = shifted(d, offset)
            d["hostname"] = host
            out = dst / incident.name / "json" / f"frnccl_rank_{d['rank']}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(d))


@pytest.fixture(scope="module")
def healthy_dumps(tmp_path_factory) -> tuple[Path, str]:
    """The healthy job's dumps (one host, one clock) and its log."""
    dump_dir = tmp_path_factory.mktemp("healthy") / "dumps"
    job = torchrun("healthy", dump_dir, FRNCCL_DUMP_ON_TEARDOWN="1")
    log = job.describe()
    assert job.ranks[0].returncode == 0, log
    assert len([p for p in dump_dir.iterdir() if p.is_dir()]) == WORLD, f"one teardown dump per rank\n{log}"
    return dump_dir, log


@pytest.mark.parametrize("clocks", list(CLOCKS))
def test_healthy_job_with_host_clock_offsets(clocks, healthy_dumps, tmp_path):
    """Exit 0 and no fault finding; and the offsets name no straggler that the same hosts on one aligned clock do
    not. The baseline keeps the host layout, since how ranks split into hosts sets the clocks' uncertainty and so
    the straggler threshold: the machine's own jitter may name a rank there, but never the offsets."""
    src, log = healthy_dumps
    aligned, dst = tmp_path / "aligned", tmp_path / "shifted"
    rewrite_clocks(src, aligned, {r: (host, 0) for r, (host, _) in CLOCKS[clocks].items()})
    rewrite_clocks(src, dst, CLOCKS[clocks])
    _, base, base_raw = analyze(aligned, log)
    rc, report, raw = analyze(dst, log)
    assert report["ranks_found"] == list(range(WORLD)), raw
    faults = [(f["kind"], f["culprit_ranks"]) for f in report["findings"] if f["severity"] in FAULT_SEVERITIES]
    assert not faults, f"a healthy job, clocks {clocks}: fault findings {faults}\n{raw}"
    assert rc == 0, raw
    late, late_aligned = ({r for ranks, _ in stragglers(rep) for r in ranks} for rep in (report, base))
    assert late <= late_aligned, (f"clocks {clocks}: the offsets made rank(s) {sorted(late - late_aligned)} "
                                  f"stragglers\n{raw}\n--- the same hosts on one clock:\n{base_raw}")


# ----------------------------------------------------------------------------- several faults at once


def test_two_independent_faults_are_both_named(tmp_path):
    """Rank MULTI_HANG hangs in compute while rank MULTI_SKIP skips its pair's all_reduce and goes on: fixing either
    alone would not fix the job, so both are named, neither is called a victim, and no innocent rank is named."""
    dump_dir = tmp_path / "dumps"
    job = torchrun("multi", dump_dir)
    rc, report, raw = analyze(dump_dir, job.describe())
    assert rc == 1, raw
    culprits = {real_jobs.MULTI_HANG, real_jobs.MULTI_SKIP}
    faults = [f for f in report["findings"] if f["severity"] in FAULT_SEVERITIES]
    named = {r for f in faults for r in f["culprit_ranks"]}
    assert named == culprits, f"named {sorted(named)}, the culprits are {sorted(culprits)}\n{raw}"
    assert not any(f["kind"] == "deadlock" for f in faults), raw
    for f in report["findings"]:
        wrong = set(f["victim_ranks"]) & culprits
        assert not wrong, f"{f['kind']} calls culprit(s) {sorted(wrong)} victims\n{raw}"


# ----------------------------------------------------------------------------- slow ranks of healthy jobs


def slow_job(shape: str, tmp_path: Path, on: str) -> tuple[int, dict[str, Any], str]:
    """A healthy job with slow ranks (it exits 0), dumped on request mid-run (``on`` "signal") or at teardown."""
    dump_dir = tmp_path / "dumps"
    if on == "signal":
        job = torchrun(shape, dump_dir, REAL_JOB_ARG="signal")
    else:
        job = torchrun(shape, dump_dir, FRNCCL_DUMP_ON_TEARDOWN="1")
    log = job.describe()
    assert job.ranks[0].returncode == 0, log
    if on == "signal":
        assert "SIGNALLED 0" in log and "DUMPS missing" not in log, log
        target = next(dump_dir.glob("*signal*"))
    else:
        target = dump_dir
    rc, report, raw = analyze(target, log)
    assert report["ranks_found"] == list(range(WORLD)), raw + log
    return rc, report, raw + log


def stragglers(report: dict[str, Any]) -> list[tuple[list[int], str]]:
    """(ranks, the group's description) of each straggler finding."""
    return [(f["culprit_ranks"], f["pg_desc"]) for f in report["findings"] if f["kind"] == "straggler"]


@pytest.mark.parametrize("on", ["signal", "teardown"])
@pytest.mark.parametrize("where", ["pair", "world"])
def test_slow_rank_of_a_healthy_job(where, on, tmp_path):
    """Rank SLOW is SLOW_S late each step, before its pair's all_reduce or before the world one, far within the
    timeout; the job exits 0. Its dump, on request mid-run or at teardown, is no fault: exit 0, and rank SLOW is
    named once as the straggler, in the group where it is late itself, not the ranks it delays."""
    rc, report, raw = slow_job(f"slow_{where}", tmp_path, on)
    faults = [(f["kind"], f["culprit_ranks"]) for f in report["findings"] if f["severity"] in FAULT_SEVERITIES]
    assert not faults, f"a healthy job: fault findings {faults}\n{raw}"
    assert rc == 0, raw
    got = stragglers(report)
    group = "pair_b" if where == "pair" else "default_pg"
    assert got == [([real_jobs.SLOW], group)], f"stragglers {got}, expected rank {real_jobs.SLOW} in {group}\n{raw}"
    # one kernel wrote every dump: its ranks share its clock, whatever the ends their watchdogs saw say
    assert [h["ranks_share_a_clock"] for h in report["clock"]["hosts"]] == [True], raw


def test_equally_late_ranks_are_named_together_or_not_at_all(tmp_path):
    """Ranks SLOW and SLOW_TOO are equally late before every world all_reduce: which one arrives last is chance,
    so a straggler finding names both of them or neither."""
    rc, report, raw = slow_job("slow_two", tmp_path, "teardown")
    assert rc == 0, raw
    pair = {real_jobs.SLOW, real_jobs.SLOW_TOO}
    for ranks, _ in stragglers(report):
        assert set(ranks) == pair, f"a straggler finding names {ranks}, not both of {sorted(pair)}\n{raw}"
