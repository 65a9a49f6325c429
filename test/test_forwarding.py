"""frnccl forwards every op to its inner Gloo backend: results equal plain gloo's.

Each test runs one multi-rank job (real processes over a real TCPStore, see
dist_harness.py) that performs many comparisons, frnccl against a plain gloo
group over the same ranks with identical inputs (workers/_worker.py: Checks).
"""

from __future__ import annotations

import itertools

import pytest

from dist_harness import Job, run_ranks

WORLD_SIZES = [2, 4]
COLLECTIVES = [
    "broadcast", "reduce", "reduce/MAX/root0", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
    "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single/even",
    "all_to_all_single/uneven", "gather", "scatter",
]
FLOAT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]
INT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
DTYPES = {"float32": FLOAT_OPS, "float64": FLOAT_OPS, "bfloat16": FLOAT_OPS, "float16": FLOAT_OPS,
          "int32": INT_OPS, "int64": INT_OPS, "uint8": INT_OPS}


def dump_env(tmp_path) -> dict[str, str]:
    """Keep any dump a job writes out of the shared /tmp/frnccl-dumps."""
    return {"FRNCCL_DUMP_DIR": str(tmp_path / "dumps")}


def checked(job: Job, only: tuple[str, ...] | None = None) -> list[dict]:
    """All ranks exited 0 and reported no failed check (of those starting with `only`)."""
    job.assert_ok()
    results = job.results()
    failures = [f"rank {r['rank']}: {f}" for r in results for f in r["failures"] if only is None or f.startswith(only)]
    assert not failures, "failed checks (frnccl vs gloo, or recorder):\n" + "\n".join(failures[:40])
    return results


def missing(results: list[dict], names: list[str], key: str = "matched") -> list[str]:
    """Names some rank did not report under `key` (so a case that silently did not run fails)."""
    return [f"rank {r['rank']}: {n}" for r in results for n in names if n not in set(r[key])]


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda w: f"world{w}")
def collectives_job(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"collectives{request.param}")
    return request.param, run_ranks("collectives.py", request.param, timeout=180, env=dump_env(tmp))


def test_collectives_match_gloo(collectives_job):
    world, job = collectives_job
    results = checked(job, only=tuple(COLLECTIVES) + ("all_reduce",))
    want = []
    for dt, ops in DTYPES.items():
        for n, mode in itertools.product([1, 1000], ["sync", "async"]):
            tag = f"{dt}/n={n}/{mode}"
            want += [f"all_reduce/RedOpType.{op}/{tag}" for op in ops if not (op == "AVG" and dt.startswith(("int", "uint")))]
            want += [f"{c}/{tag}" for c in COLLECTIVES]
    big = ["all_reduce/RedOpType.SUM", "all_reduce/RedOpType.MAX", "broadcast", "reduce", "all_gather",
           "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single/uneven", "scatter"]
    for tag in ["float32/n=1048576/sync", "float32/n=1048576/async", "int64/n=1048576/sync", "bfloat16/n=1048576/sync"]:
        want += [f"{c}/{tag}" for c in big]
    assert not missing(results, want), "\n".join(missing(results, want)[:40])
    assert all(len(r["matched"]) >= len(want) for r in results)


def test_unsupported_combinations_raise_like_gloo(collectives_job):
    """Where gloo refuses an op/dtype combination, frnccl raises the same Python error."""
    _, job = collectives_job
    results = checked(job, only=("all_reduce/",))
    for r in results:
        errs = r["errors_matched"]
        for tag in ["float32/n=1000/sync", "float32/n=1000/async"]:
            assert any(e.startswith(f"all_reduce/RedOpType.BAND/{tag}:") for e in errs), errs
        assert any(e.startswith("all_reduce/RedOpType.AVG/int64/n=1000/sync:") for e in errs), errs


def test_barriers_wait_for_late_rank(collectives_job):
    _, job = collectives_job
    results = checked(job, only=("barrier", "monitored_barrier"))
    assert not missing(results, ["barrier/sync", "barrier/async", "monitored_barrier/method"])


def test_dist_monitored_barrier(collectives_job):
    """dist.monitored_barrier() takes a frnccl group on every torch version (before 2.14 through the wrapper
    registration puts in place of torch's function, whose own check refuses any backend but gloo)."""
    _, job = collectives_job
    results = checked(job, only=("dist.monitored_barrier",))
    assert not missing(results, [f"dist.monitored_barrier/{k}" for k in ("group", "float_timeout", "default_timeout")])
    for r in results:
        assert r["notes"]["dist.monitored_barrier"] == "ok", r["notes"]["dist.monitored_barrier"]


def test_objects_match_gloo(collectives_job):
    _, job = collectives_job
    assert not missing(checked(job, only=("all_gather_object", "broadcast_object_list")),
                       ["all_gather_object", "broadcast_object_list"])


def test_meta_tensor_behaves_like_gloo(collectives_job):
    """A 'meta' tensor is answered by torch's meta kernels: no crash, same as gloo."""
    _, job = collectives_job
    assert not missing(checked(job, only=("meta_tensor",)), ["meta_tensor/all_reduce"])


def test_get_backend_is_frnccl(collectives_job):
    _, job = collectives_job
    assert not missing(checked(job, only=("get_backend",)), ["get_backend", "get_backend/gloo_group"])


@pytest.mark.parametrize("world", WORLD_SIZES, ids=lambda w: f"world{w}")
def test_p2p_match_gloo(world, tmp_path):
    results = checked(run_ranks("p2p.py", world, timeout=120, env=dump_env(tmp_path)))
    want = []
    for dt in ["float32", "float64", "int32", "int64", "bfloat16", "uint8"]:
        for n in [1, 1000] + ([1048576] if dt in ("float32", "int64") else []):
            want += [f"{k}/{dt}/n={n}" for k in ("send_recv", "isend_irecv", "batch_isend_irecv")]
    want += ["recv_any_source/sync", "recv_any_source/async"]
    assert not missing(results, want), "\n".join(missing(results, want)[:40])
    assert "recv_any_source/senders" in results[0]["matched"]


@pytest.mark.parametrize("default", ["frnccl", "gloo"], ids=lambda d: f"default_{d}")
def test_subgroups_match_gloo(default, tmp_path):
    """new_group([0, 2]) / new_group([1, 3]) and a full new_group through frnccl, 4 ranks."""
    results = checked(run_ranks("subgroups.py", 4, default, timeout=120, env=dump_env(tmp_path)))
    want = ["default_backend", "get_backend/fr_world", "get_backend/fr_sub", "sub_size"]
    for label in ("sub", "world"):
        want += [f"{k}/{label}" for k in ("send_recv", "barrier", "objects")]
        for dt, mode in itertools.product(["float32", "int64", "bfloat16"], ["sync", "async"]):
            want += [f"{c}/{label}/{dt}/{mode}" for c in COLLECTIVES + ["all_reduce/RedOpType.SUM"]]
    assert not missing(results, want), "\n".join(missing(results, want)[:40])


@pytest.mark.parametrize("world", WORLD_SIZES, ids=lambda w: f"world{w}")
def test_recorder_sees_what_ran(world, tmp_path):
    results = checked(run_ranks("recorder.py", world, timeout=120, env=dump_env(tmp_path)))
    want = ["sequence_results", "entry_count", "all_completed", "collective_names", "collective_seq_ids",
            "collective_p2p_seq_zero", "op_ids_increase", "sizes", "dtypes", "p2p_entries",
            "p2p_collective_seq_zero", "p2p_sizes", "pg_status", "pg_config", "default_pg_entry"]
    assert not missing(results, want), "\n".join(missing(results, want))
    assert "in_flight_not_completed" in results[1]["matched"] and "in_flight_then_completed" in results[1]["matched"]
    if world == 4:
        assert not missing(results, ["sub_p2p_entry"])


def test_finished_ops_never_time_out(tmp_path):
    """Every op completes in the recorder; none trips the watchdog after the group timeout passes."""
    job = run_ranks("quiet_watchdog.py", 2, timeout=120, env=dump_env(tmp_path))
    incidents = [ln for r in job.ranks for ln in r.output.splitlines() if ln.startswith("[frnccl rank")]
    assert not incidents, "false incident:\n" + "\n".join(incidents) + "\n" + job.describe()
    results = checked(job)
    assert not missing(results, ["ops_recorded", "all_completed_after_timeout", "group_still_usable"])



def test_caller_recovers_on_cpu(tmp_path):
    """A coalescing block of CPU ops (run one by one: Gloo cannot coalesce) is waited for as a whole, and an op
    torch refuses before issuing it, caught by one rank, leaves that rank's seqs in step with its peer's."""
    results = checked(run_ranks("caller_recovers.py", 2, timeout=120, env=dump_env(tmp_path)))
    assert not missing(results, ["coalesced_all_reduce_waited", "coalesced_p2p_waited", "all_reduce_after_refusal"])
    for r in results:  # gloo refuses it, and frnccl raises gloo's error
        assert any(e.startswith("refused_while_running_waited_late:") for e in r["errors_matched"]), r
    by_rank = {r["rank"]: r["notes"] for r in results}
    assert by_rank[0].get("refused_with"), by_rank[0]
    assert by_rank[0]["collectives"] == by_rank[1]["collectives"], by_rank
    assert by_rank[0]["p2p_seqs"] == by_rank[1]["p2p_seqs"], by_rank
    assert not any("broadcast" in name for name, _ in by_rank[0]["collectives"]), by_rank[0]["collectives"]


def test_monitored_barrier_wrapper_leaves_other_groups_to_torch():
    """Registration wraps dist.monitored_barrier only where torch refuses frnccl, and hands everything that is
    not a frnccl group to torch's own function, so its errors stay torch's."""
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from torch.torch_version import TorchVersion

    import fr_backend  # noqa: F401 (registers, as torch's entry point already did)

    wrapped = TorchVersion(torch.__version__) < "2.14.0.dev0"
    assert dist.monitored_barrier is c10d.monitored_barrier
    assert hasattr(dist.monitored_barrier, "__wrapped__") == wrapped
    if not wrapped:
        return
    original = dist.monitored_barrier.__wrapped__
    assert original.__module__ == "torch.distributed.distributed_c10d"
    for fn in (dist.monitored_barrier, original):  # no default group: torch's error, through both
        with pytest.raises(ValueError, match="Default process group has not been initialized"):
            fn()
