"""Real workloads run under frnccl and under gloo give the same results, and frnccl lets them idle past a short
group timeout without an incident (workers/workload.py, workers/_workload.py).

Each workload runs twice as a real job (processes over a real TCPStore): once with the default backend
frnccl, once with gloo. Results are compared bit for bit: frnccl hands every op to the same Gloo
algorithm. Under frnccl each rank then waits until the group timeout (3 s) has passed for every op it
issued and asks for a dump, which waits for a watchdog pass made after that moment: a false timeout
shows as a timeout line in the rank's log, an incident folder, an entry not completed, or a failed job.
"""

from __future__ import annotations

import pytest

from dist_harness import Job, run_ranks

WORLD = {"dtensor_2d": 4}
FRNCCL_LINE = "[frnccl rank"  # how frnccl's watchdog, dump launcher and dump writer log
OWN_DUMP = "reason past_timeout"  # the dump each rank asks for (workers/_workload.py), and nothing else


def _run(workload: str, backend: str, tmp_path) -> Job:
    world = WORLD.get(workload, 2)
    return run_ranks("workload.py", world, workload, backend, timeout=240,
                     env={"FRNCCL_DUMP_DIR": str(tmp_path / f"dumps-{backend}"), "WORKLOAD_TIMEOUT_S": "3"})


def _false_alarms(job: Job) -> list[str]:
    return [f"rank {r.rank}: {ln}" for r in job.ranks for ln in r.output.splitlines()
            if ln.startswith(FRNCCL_LINE) and OWN_DUMP not in ln]


def _checked(job: Job, backend: str) -> list[dict]:
    alarms = _false_alarms(job)
    assert not alarms, f"frnccl reported a timeout in a healthy {backend} job:\n" + "\n".join(alarms) + "\n" + job.describe()
    job.assert_ok()
    return job.results()


def _assert_quiet_past_timeout(result: dict, where: str) -> None:
    past = result["past_timeout"]
    views = past.values() if "all_reduce_after" not in past else [past]
    for view in views:
        assert view["entries"] > 0, f"{where}: the dump after the timeout recorded nothing: {view}"
        assert view["other_incidents"] == [], f"{where}: incident folders after idling past the timeout: {view}"
        assert view["not_completed"] == [], f"{where}: finished ops not shown completed after the timeout: {view}"
        assert view["all_reduce_after"] == result["world"], f"{where}: the group no longer works: {view}"


@pytest.mark.parametrize("workload", ["ddp", "fsdp2", "dtensor_2d", "funcol", "funcol_compiled", "p2p", "objects"])
def test_workload_matches_gloo_and_survives_timeout(workload, tmp_path):
    gloo = _checked(_run(workload, "gloo", tmp_path), "gloo")
    fr = _checked(_run(workload, "frnccl", tmp_path), "frnccl")
    for g, f in zip(gloo, fr):
        assert g["rank"] == f["rank"]
        assert g["digests"] and f["digests"].keys() == g["digests"].keys(), (g, f)
        differ = sorted(k for k in g["digests"] if g["digests"][k] != f["digests"][k])
        assert not differ, f"rank {g['rank']}: results differ from gloo's in {differ}"
        _assert_quiet_past_timeout(f, f"rank {f['rank']}")
        if "compiled_equals_eager" in f:
            assert f["compiled_equals_eager"] and g["compiled_equals_eager"], (g, f)
