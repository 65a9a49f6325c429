"""Start-up and teardown of frnccl: entry-point registration, clean exits, threads."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from dist_harness import WORKERS, _env, free_port, run_commands, run_ranks

EXIT_BOUND_S = 5.0  # from a script's last line to its process being gone


def python_c(code: str, env_extra: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = _env(0, 1, free_port(), env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("destroy", [True, False], ids=["destroy", "no_destroy"])
def test_torchrun_unmodified_script(destroy, tmp_path):
    """torchrun + a script that never imports fr_backend: the entry point registers frnccl."""
    script = WORKERS / "plain_script.py"
    assert not re.search(r"^\s*(import|from)\s+fr_backend", script.read_text(), re.M), "the script must not import fr_backend"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--monitor-interval=0.1", str(script)] + (["--destroy"] if destroy else [])
    env = {**_env(0, 1, free_port(), {"FRNCCL_DUMP_DIR": str(tmp_path / "dumps")})}
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(key)  # torchrun sets them per rank
    job = run_commands([cmd], [env], timeout=120).assert_ok()
    out = job.ranks[0].output
    oks = [ln for ln in out.splitlines() if ln.startswith("OK ")]
    # OK <get_backend()> <fr_backend._C loaded> <LOCAL_RANK set by torchrun>
    assert oks == ["OK frnccl True True"] * 2, out
    dones = [float(ln.split()[1]) for ln in out.splitlines() if ln.startswith("DONE_MONO ")]
    assert len(dones) == 2, out
    lag = job.ranks[0].exited_mono - max(dones)
    assert lag < EXIT_BOUND_S + 2, f"torchrun took {lag:.1f}s to exit after the ranks finished\n{out}"


@pytest.mark.parametrize("destroy", [True, False], ids=["destroy", "no_destroy"])
def test_clean_exit(destroy, tmp_path):
    """Both with and without destroy_process_group the ranks exit 0, promptly."""
    job = run_ranks("plain_script.py", 2, *(["--destroy"] if destroy else []), timeout=60,
                    env={"FRNCCL_DUMP_DIR": str(tmp_path / "dumps")}).assert_ok()
    for r in job.ranks:
        assert "OK frnccl True True" in r.output, r.output
        # No warning from torch about how frnccl uses it, and no line of frnccl's own, in a healthy job.
        noisy = [ln for ln in r.output.splitlines() if not ln.startswith(("OK ", "DONE_MONO "))
                 and ("Warning" in ln or ln.startswith("[W") or "frnccl" in ln or "fr_backend" in ln)]
        assert not noisy, r.output
        lag = r.exit_lag_s()
        assert lag is not None and lag < EXIT_BOUND_S, f"rank {r.rank} exit lag {lag}\n{job.describe()}"


@pytest.mark.parametrize("mode", ["destroy", "abort", "exit"])
def test_teardown_stops_threads(mode, tmp_path):
    """destroy_process_group / _abort_process_group return in < 2 s, stop frnccl-watchdog/-monitor, and free
    the tensors of the last ops."""
    job = run_ranks("lifecycle.py", 2, mode, timeout=60, env={"FRNCCL_DUMP_DIR": str(tmp_path / "dumps")}).assert_ok()
    results = job.results()
    failures = [f"rank {r['rank']}: {f}" for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures) + "\n" + job.describe()
    want = {"all_reduce", "last_op", "last_tensor_held", "threads_running", "torch_fr_off"}
    if mode != "exit":
        want |= {f"{mode}_fast", "threads_stopped", "last_tensor_freed"}
    for r in results:
        assert want <= set(r["matched"]), r
    for r in job.ranks:
        lag = r.exit_lag_s()
        assert lag is not None and lag < EXIT_BOUND_S, f"rank {r.rank} exit lag {lag}\n{job.describe()}"



def test_abort_does_not_wait_for_a_dump(tmp_path):
    """_abort_process_group returns at once while a job-wide dump waits (up to its 8 s deadline) for a rank
    that left; only destroy_process_group lets such a dump finish."""
    job = run_ranks("abort_during_dump.py", 2, timeout=60,
                    env={"FRNCCL_DUMP_DIR": str(tmp_path / "dumps"), "FRNCCL_DUMP_TIMEOUT_SEC": "8"})
    job.assert_ok()
    [result] = [r for r in job.results() if r["rank"] == 0]
    assert "abort_fast" in result["matched"], (result, job.describe())
    assert "asking all 2 ranks to dump" in job.ranks[0].output, job.describe()


@pytest.mark.parametrize("interface", ["lo", "nosuchif0"])
def test_gloo_socket_ifname_is_honoured(interface):
    """GLOO_SOCKET_IFNAME picks the interface of frnccl's inner gloo group, as it does for torch's own gloo: a
    name no interface has fails the same way for both (frnccl used to bind the default interface silently)."""
    code = (
        "import sys, torch, torch.distributed as dist\n"
        "dist.init_process_group(sys.argv[1])\n"
        "t = torch.ones(2)\n"
        "dist.all_reduce(t)\n"
        "print('sum', t.tolist())\n"
        "dist.destroy_process_group()\n"
    )
    runs = {}
    for backend in ("gloo", "frnccl"):
        env = _env(0, 1, free_port(), {"GLOO_SOCKET_IFNAME": interface})
        runs[backend] = subprocess.run([sys.executable, "-c", code, backend], env=env, capture_output=True, text=True,
                                       timeout=60)
    for backend, res in runs.items():
        if interface == "lo":
            assert res.returncode == 0 and "sum [1.0, 1.0]" in res.stdout, (backend, res.stdout, res.stderr)
        else:
            assert res.returncode != 0 and interface in res.stderr, (backend, res.stdout, res.stderr)

def test_import_torch_does_not_load_native_code():
    code = (
        "import sys, torch, torch.distributed as dist\n"
        "print('native', 'fr_backend._C' in sys.modules)\n"
        "print('registered', 'FRNCCL' in dist.Backend._plugins)\n"
    )
    res = python_c(code, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"})
    assert res.returncode == 0, res.stderr
    # The entry point ran (frnccl is registered) but loaded no native code.
    assert res.stdout.split("\n")[:2] == ["native False", "registered True"], res.stdout + res.stderr


def test_autoload_prints_nothing():
    res = python_c("import torch", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"})
    assert res.returncode == 0 and res.stdout == "" and res.stderr == "", (res.stdout, res.stderr)
    # With every warning shown, none comes from frnccl.
    res = python_c("import torch, sys; assert 'fr_backend._registration' in sys.modules",
                   {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1", "PYTHONWARNINGS": "always"})
    assert res.returncode == 0, res.stderr
    noisy = [ln for ln in (res.stdout + res.stderr).splitlines() if "frnccl" in ln or "fr_backend" in ln]
    assert not noisy, noisy


def test_pg_options_are_said_to_be_unused():
    """frnccl builds its inner groups itself: options meant for one of them are not silently dropped."""
    code = (
        "import torch.distributed as dist\n"
        "from torch._C._distributed_c10d import ProcessGroupGloo\n"
        "dist.init_process_group('frnccl', pg_options=ProcessGroupGloo._Options())\n"
        "dist.destroy_process_group()\n"
    )
    res = python_c(code)
    assert res.returncode == 0, res.stderr
    assert "frnccl: pg_options (_Options) are not used" in res.stderr, res.stderr


def test_failed_registration_never_breaks_import_torch():
    """The entry point imports the package, whose own import registers too: if torch refuses the registration,
    `import torch` still works, with one warning."""
    fault = str(WORKERS.parent / "autoload_fault")
    res = python_c("import torch; print('imported')", {"TORCH_DEVICE_BACKEND_AUTOLOAD": "1", "PYTHONPATH": fault})
    assert res.returncode == 0 and "imported" in res.stdout, res.stderr
    assert res.stderr.count("frnccl: backend not registered (ValueError: registration refused for the test)") == 1, \
        res.stderr


@pytest.mark.parametrize("on_teardown", ["1", "0"])
def test_dump_on_teardown(on_teardown, tmp_path):
    """FRNCCL_DUMP_ON_TEARDOWN=1: destroy_process_group leaves one dump of the rank's ops, reason teardown."""
    code = (
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('frnccl')\n"
        "t = torch.ones(2)\n"
        "dist.all_reduce(t)\n"
        "dist.destroy_process_group()\n"
    )
    res = python_c(code, {"FRNCCL_DUMP_ON_TEARDOWN": on_teardown, "FRNCCL_DUMP_DIR": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    files = sorted(tmp_path.glob("*/compact/*"))
    if on_teardown == "0":
        assert not files, files
        return
    assert len(files) == 1, (files, res.stderr)
    from fr_backend import load_dump

    dump = load_dump(str(files[0]))
    assert dump["dump_reason"] == "teardown" and dump["stacks_symbolized"] is False, dump["dump_reason"]
    assert [e["profiling_name"] for e in dump["entries"]] == ["gloo:all_reduce"], dump["entries"]


def test_set_default_timeout_reaches_frnccl_and_its_inner_groups():
    """The group's timeout can be changed as for gloo and nccl groups: frnccl's own ops and the inner Gloo group
    take the new value (torch's _set_pg_timeout reaches only gloo and nccl backends before torch 2.14)."""
    code = (
        "import torch, torch.distributed as dist, fr_backend\n"
        "from datetime import timedelta\n"
        "dist.init_process_group('frnccl', timeout=timedelta(seconds=40))\n"
        "backend = dist.group.WORLD._get_backend(torch.device('cpu'))\n"
        "backend._set_default_timeout(timedelta(seconds=7))\n"
        "dist.all_reduce(torch.ones(2))\n"
        "print('gloo', backend.cpu_backend.options._timeout.total_seconds())\n"
        "print('op', fr_backend.trace_entries(symbolize=False)['entries'][-1]['timeout_ms'])\n"
        "dist.destroy_process_group()\n"
    )
    res = python_c(code)
    assert res.returncode == 0, res.stderr
    assert "gloo 7.0" in res.stdout and "op 7000" in res.stdout, res.stdout


TEARDOWN_DUMP_TIMEOUT_S = 30  # what a teardown that waited for a rank that left would cost
TEARDOWN_BOUND_S = 10.0


@pytest.mark.parametrize("mode", ["race", "pending", "left"])
def test_timeout_right_before_teardown(mode, tmp_path):
    """Rank 0 alone calls barrier() on a group with a 1 s timeout, catches the error and calls
    destroy_process_group() at once; rank 1 shuts down cleanly (workers/teardown_after_timeout.py says when). The
    failure rank 0 saw is always dumped; rank 1 writes its part if the request reached the store before it left,
    and otherwise says in the store that it left; neither rank's destroy_process_group() waits out the dump
    deadline. Before: rank 0's teardown often stopped its threads before any pass reported the timeout (no dump
    at all), and otherwise waited the whole deadline for rank 1, which never served the request."""
    dump_dir = tmp_path / "dumps"
    env = {"FRNCCL_DUMP_DIR": str(dump_dir), "FRNCCL_DUMP_TIMEOUT_SEC": str(TEARDOWN_DUMP_TIMEOUT_S),
           "FRNCCL_COORD_CHECK_MS": "60000" if mode == "pending" else "1000"}
    job = run_ranks("teardown_after_timeout.py", 2, mode, timeout=120, env=env)
    log = job.describe()
    job.assert_ok()
    results = job.results()
    failures = [f"rank {r['rank']}: {f}" for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures) + "\n" + log
    for r in results:
        assert r["notes"]["destroy_s"] < TEARDOWN_BOUND_S, f"rank {r['rank']}'s destroy took {r['notes']['destroy_s']} s\n{log}"
    assert "barrier_error" in results[0]["notes"], log
    # With rank 1's process gone (left), Gloo may fail the barrier on the closed connection before its timeout.
    reasons = ("timeout", "error") if mode == "left" else ("timeout",)
    folders = [p for p in dump_dir.iterdir() if p.is_dir()] if dump_dir.exists() else []
    assert len(folders) == 1 and any(f"-{r}-r0" in folders[0].name for r in reasons), f"{folders}\n{log}"
    from fr_backend import load_dump

    dump = load_dump(str(folders[0] / "compact" / "frnccl_rank_0.json.gz"))
    assert dump["dump_reason"] in reasons and f"-{dump['dump_reason']}-r0" in folders[0].name, log
    rank1_wrote = (folders[0] / "compact" / "frnccl_rank_1.json.gz").is_file()
    summary = [ln for ln in job.ranks[0].output.splitlines() if f"dump {folders[0].name}: " in ln]
    assert len(summary) == 1, log
    if mode == "pending":
        assert rank1_wrote and "2/2 ranks wrote in" in summary[0] and ";" not in summary[0], log
    elif mode == "left":
        assert not rank1_wrote and summary[0].endswith("; ranks that had left the job: 1"), log
    else:
        assert (rank1_wrote and "2/2 ranks wrote" in summary[0]) or \
            (not rank1_wrote and summary[0].endswith("; ranks that had left the job: 1")), log


def test_fork_after_init_is_inert_in_the_child(tmp_path):
    """fork() after frnccl's threads started: in the child, fr_backend.dump() fails at once with one line that says
    why, and the exit handlers do not wait for threads that stayed in the parent; the parent goes on unharmed.
    Before: the child's dump waited two dump deadlines (here 2 x 3 s) and then blamed a stuck dump thread, and its
    exit waited for the parent's threads."""
    job = run_ranks("fork_after_init.py", 2, timeout=90,
                    env={"FRNCCL_DUMP_DIR": str(tmp_path / "dumps"), "FRNCCL_DUMP_TIMEOUT_SEC": "3"})
    log = job.describe()
    job.assert_ok()
    results = job.results()
    failures = [f"rank {r['rank']}: {f}" for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures) + "\n" + log
    want = {"child_exit_status", "child_dump_refused_at_once", "child_dump_says_why", "child_exit_fast",
            "parent_all_reduce", "parent_dump"}
    for r in results:
        assert want <= set(r["matched"]), (r, log)


def test_dump_signal_the_system_refuses_is_reported():
    """A dump signal that sigaction() refuses (32, which the C library keeps for itself; FRNCCL_DUMP_SIGNAL no longer
    accepts it, so the check is reached here by patching the parser) is one log line, not silence: that signal would
    otherwise keep its default action and end the rank."""
    code = (
        "import torch.distributed as dist\n"
        "import fr_backend.config as config\n"
        "config._signal = lambda env, name, default: 32\n"
        "dist.init_process_group('frnccl')\n"
        "dist.destroy_process_group()\n"
        "print('done')\n"
    )
    res = python_c(code)
    assert res.returncode == 0 and "done" in res.stdout, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if "FRNCCL_DUMP_SIGNAL" in ln]
    assert lines == ["[frnccl rank 0] cannot handle FRNCCL_DUMP_SIGNAL=32 (sigaction: Invalid argument); this rank "
                     "does not dump on that signal"], res.stderr
