"""Real workloads run under frnccl and under gloo give the same results, and frnccl lets them idle past a short
group timeout without an incident (workers/workload.py, workers/_workload.py).

The workloads run in three jobs (real processes over a real TCPStore), each once with the default backend
frnccl and once with gloo: training (DDP, FSDP2, pipeline p2p, object collectives; 2 ranks), functional
collectives eager and under torch.compile (2 ranks), DTensor on a 2x2 DeviceMesh (4 ranks). Results are
compared bit for bit: frnccl hands every op to the same Gloo algorithm. Under frnccl each rank then waits
until the group timeout (3 s) has passed for every op it issued and asks for a dump, which waits for a
watchdog pass made after that moment: a false timeout shows as a frnccl log line, an incident folder, an
entry not completed, or a failed job.
"""

from __future__ import annotations

from typing import Any

import pytest

from dist_harness import Job, run_ranks

JOBS = {  # job -> (ranks, workloads in the order they run)
    "training": (2, ["ddp", "fsdp2", "p2p", "objects"]),
    "funcol": (2, ["funcol", "funcol_compiled"]),
    "dtensor": (4, ["dtensor_2d"]),
}
WORKLOADS = {w: job for job, (_, ws) in JOBS.items() for w in ws}
FRNCCL_LINE = "[frnccl rank"  # how frnccl's watchdog, dump launcher and dump writer log
OWN_DUMP = "reason past_timeout"  # the dump each rank asks for (workers/_workload.py), and nothing else


@pytest.fixture(scope="module")
def jobs(tmp_path_factory) -> Any:
    """Runs each job under both backends the first time a test asks for it."""
    done: dict[tuple[str, str], Job] = {}

    def get(job: str, backend: str) -> Job:
        if (job, backend) not in done:
            world, workloads = JOBS[job]
            dumps = tmp_path_factory.mktemp(f"{job}-{backend}")
            done[job, backend] = run_ranks("workload.py", world, ",".join(workloads), backend, timeout=240,
                                           env={"FRNCCL_DUMP_DIR": str(dumps), "WORKLOAD_TIMEOUT_S": "3"})
        return done[job, backend]

    return get


def _false_alarms(job: Job) -> list[str]:
    return [f"rank {r.rank}: {ln}" for r in job.ranks for ln in r.output.splitlines()
            if ln.startswith(FRNCCL_LINE) and OWN_DUMP not in ln]


def _results(job: Job, backend: str, workload: str) -> list[dict]:
    """Each rank's result, once the job shows no false alarm and the workload ran without error."""
    alarms = _false_alarms(job)
    assert not alarms, (f"frnccl reported a timeout in a healthy {backend} job ({workload}):\n" + "\n".join(alarms)
                        + "\n" + job.describe())
    errors = [f"rank {r.rank}: {ln}" for r in job.ranks for ln in r.output.splitlines() if "Error" in ln]
    results = job.results() if all(r.returncode == 0 for r in job.ranks) else []
    for res in results:
        assert "error" not in res["workloads"].get(workload, {}), (workload, res["workloads"][workload])
    if not results:
        pytest.fail(f"the {backend} job running {workload} failed:\n" + "\n".join(errors[-10:]) + "\n"
                    + job.describe(), pytrace=False)
    return results


def _assert_quiet_past_timeout(result: dict, where: str) -> None:
    past = result["past_timeout"]
    assert past["entries"] > 0, f"{where}: the dump after the timeout recorded nothing: {past}"
    assert past["other_incidents"] == [], f"{where}: incident folders after idling past the timeout: {past}"
    assert past["not_completed"] == [], f"{where}: finished ops not shown completed after the timeout: {past}"
    broken = [g for g, ok in past["all_reduce_after"].items() if not ok]
    assert not broken and past["all_reduce_after"], f"{where}: groups that no longer work: {past}"


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_workload_matches_gloo_and_survives_timeout(workload, jobs):
    job = WORKLOADS[workload]
    gloo = _results(jobs(job, "gloo"), "gloo", workload)
    fr = _results(jobs(job, "frnccl"), "frnccl", workload)
    assert [r["rank"] for r in gloo] == [r["rank"] for r in fr] == list(range(JOBS[job][0]))
    for g, f in zip(gloo, fr):
        want, got = g["workloads"][workload]["digests"], f["workloads"][workload]["digests"]
        assert want and got.keys() == want.keys(), (want, got)
        differ = sorted(k for k in want if want[k] != got[k])
        assert not differ, f"rank {g['rank']}: {workload}'s results differ from gloo's in {differ}"
        if "compiled_equals_eager" in want:
            assert want["compiled_equals_eager"] == got["compiled_equals_eager"] == "True", (want, got)
        _assert_quiet_past_timeout(f, f"rank {f['rank']} ({job} job)")
