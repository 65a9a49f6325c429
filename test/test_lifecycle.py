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


def test_timeout_abort_on_its_way_aborts_no_group_of_the_next_life(tmp_path):
    """A timeout's abort checks that its life is still the current one, then aborts that life's groups. Held
    open between the two (FRNCCL_TEST_HOLD_ABORT) while the job tears down and starts a new life, it must not
    abort the new life's groups (before: it read the live groups only after the hold, the new life's, and
    the new life's first all_reduce raised "aborted")."""
    # The teardown waits for the incident in flight up to the dump deadline, then goes on: 3 s here.
    env = {"FRNCCL_DUMP_DIR": str(tmp_path / "dumps"), "FRNCCL_TEST_HOLD_ABORT": str(tmp_path / "abort"),
           "FRNCCL_DUMP_TIMEOUT_SEC": "3",
           "NEW_INIT_METHOD": f"tcp://127.0.0.1:{free_port()}"}
    job = run_ranks("abort_held_past_new_life.py", 2, timeout=120, env=env)
    log = job.describe()
    assert (tmp_path / "abort.held").exists() and (tmp_path / "abort.done").exists(), f"the abort was not held: {sorted(p.name for p in tmp_path.iterdir())}\n{log}"
    assert "aborting the communicators" in job.ranks[0].output, log
    assert "OLD_OP_COMPLETED True" in job.ranks[0].output, log
    job.assert_ok()
    for r in job.ranks:
        assert "NEW_LIFE_OPS 24" in r.output, log  # three all_reduces of ones(4) over 2 ranks: 8 each


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


# ----------------------------------------------------------------------------- restarts inside one process

LIVES = 20
WARM_LIVES = 3  # lives after which sockets, threads and init time must stay where they are
REINIT_PG_TIMEOUT_S = 3


def _reinit_job(store: str, tmp_path, *extra: str) -> tuple[list[dict], str]:
    dump_dir = tmp_path / "dumps"
    job = run_ranks("reinit.py", 2, store, str(LIVES), *extra, timeout=400,
                    env={"FRNCCL_DUMP_DIR": str(dump_dir), "REINIT_PG_TIMEOUT_S": str(REINIT_PG_TIMEOUT_S),
                         "REINIT_SYNC_PORT": str(free_port())})
    log = job.describe()
    job.assert_ok()
    results = job.results()
    failures = [f"rank {r['rank']}: {f}" for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures) + "\n" + log
    return results, log


def _assert_flat(results: list[dict], log: str, lives: int) -> None:
    """Socket fds, threads and the recorder's group slots after each of the first `lives` teardowns (both
    processes past it) do not grow after the warm-up, on the process that hosts the store and on the other; nor
    does the init time."""
    for r in results:
        notes = r["notes"]
        fds, threads, init_s = notes["fds"][:lives], notes["threads"][:lives], notes["init_s"][:lives]
        assert len(notes["fds"]) == LIVES and len(notes["init_s"]) == LIVES, (r["rank"], notes)
        # Never above the count after the warm-up: a leak grows life after life. Fewer is no leak (the last
        # life's count can be taken after the peer closed its connections to the store's host).
        assert max(fds[WARM_LIVES:]) <= fds[WARM_LIVES], \
            f"process {r['rank']}: socket fds after each life {fds}\n{log}"
        assert max(threads[WARM_LIVES:]) <= threads[WARM_LIVES], \
            f"process {r['rank']}: threads after each life {threads}\n{log}"
        # The recorder's group list: each life's 3 groups take the slots of a life whose groups are gone. Before,
        # it grew by 3 a life (torchft makes a group per quorum, thousands in a long job).
        slots = notes["pg_slots"][:lives]
        assert len(slots) == len(fds) and max(slots[WARM_LIVES:]) <= slots[WARM_LIVES], \
            f"process {r['rank']}: recorder group slots after each life {slots}\n{log}"
        assert not any(name.startswith("frnccl-") for name in notes["thread_names"]), notes["thread_names"]
        # Medians: any new store connection can stall torch's store server (it looks the peer's address up in
        # DNS; 5 s where that times out), at any life. A cost that grows with the lives moves the median.
        early = sorted(init_s[1:WARM_LIVES + 5])
        late = sorted(init_s[-7:])
        assert late[len(late) // 2] <= 2 * early[len(early) // 2] + 0.5, \
            f"process {r['rank']}: init seconds per life {init_s}\n{log}"


def _assert_life_dumps(results: list[dict], log: str) -> None:
    """The local dumps of lives 0 and 1, in which the two processes had swapped ranks: each names the rank of its
    own life, in its file name and header, and holds only that life's groups (torch names them 0, 1, 2 again)."""
    for r in results:
        dumps = r["notes"]["dumps"]
        assert [d["life"] for d in dumps] == [0, 1], dumps
        for d in dumps:
            assert d["files"] == [f"frnccl_rank_{d['rank']}.json.gz"], (r["rank"], d, log)
            assert (d["header_rank"], d["world_size"], d["life_key"]) == (d["rank"], 2, d["life"]), (r["rank"], d)
            assert d["pgs"] == ["0", "1", "2"] and d["entry_pgs"] == ["0", "1", "2"], (r["rank"], d)
        assert dumps[0]["rank"] != dumps[1]["rank"], dumps


def test_twenty_lives_with_swapped_ranks_then_a_hang(tmp_path):
    """torchft's way: one TCPStore for the run, init_process_group over a PrefixStore of it, 20 times in one
    process, the two processes swapping ranks every life, ops on two frnccl subgroups in each. Socket fds, threads
    and init time stay flat; the dumps of each life carry its own rank and groups. In the 20th life rank 1 (the
    process that was rank 0 in the first) never joins an all_reduce: rank 0 times out after 3 s, the job dumps,
    the log line and both files name the 20th life's ranks, and the analyzer names rank 1 (`not_joined`).
    Before: each life kept 1 more store connection open on each process (3 sockets on the store's host), the dumps, file names and log lines kept the first life's rank, and a dump held every earlier life's
    entries under the same group names."""
    results, log = _reinit_job("shared", tmp_path, "hang")
    _assert_flat(results, log, LIVES - 1)  # the last teardown follows the hang
    _assert_life_dumps(results, log)

    victim = next(r for r in results if r["notes"]["last_rank"] == 0)
    culprit = next(r for r in results if r["notes"]["last_rank"] == 1)
    assert victim["rank"] == 1 and culprit["rank"] == 0, results  # the first life's numbering was the other way
    assert "timed out" in victim["notes"].get("victim_error", ""), (victim["notes"], log)
    dump_dir = tmp_path / "dumps"
    folders = [p for p in dump_dir.iterdir() if p.is_dir() and "-timeout-" in p.name]
    assert len(folders) == 1 and re.search(r"-timeout-r0(-\d+)?$", folders[0].name), f"{folders}\n{log}"
    folder = folders[0]
    assert sorted(p.name for p in (folder / "compact").iterdir()) == ["frnccl_rank_0.json.gz", "frnccl_rank_1.json.gz"]
    from fr_backend import load_dump

    for life_rank in (0, 1):
        d = load_dump(str(folder / "compact" / f"frnccl_rank_{life_rank}.json.gz"))
        assert (d["rank"], d["world_size"], d["life"]) == (life_rank, 2, LIVES - 1), (life_rank, d["rank"], d["life"])
        assert sorted(d["pg_config"]) == ["0", "1", "2"], sorted(d["pg_config"])
    # The victim's process (rank 1 of the first life) logs as rank 0 of this one.
    victim_out = log.split("----- rank 1 exit=")[1]
    assert re.search(r"^\[frnccl rank 0\] timeout on pg 2 ", victim_out, re.M), log
    assert not re.search(r"^\[frnccl rank 1\] timeout", victim_out, re.M), log

    from test_incidents import analyze

    rc, report, raw = analyze(folder)
    assert rc == 1, raw
    first = report["findings"][0]
    assert first["kind"] == "not_joined" and first["culprit_ranks"] == [1] and first["victim_ranks"] == [0], raw


def test_twenty_lives_over_env_init_stay_flat(tmp_path):
    """init_method="env://" 20 times in one process, as elastic re-init does: torch builds a new TCPStore each
    life (on a new port), hosted by rank 0. Socket fds, threads and init time stay flat on both processes.
    Before: each life left one more store connection open on each process."""
    results, log = _reinit_job("env", tmp_path)
    _assert_flat(results, log, LIVES)


def test_restart_count_that_is_not_a_number_is_one_line():
    """A launcher's restart count that is not a number is said in one warning naming it, and the job runs (the
    dumps record attempt 0). Before: int() raised inside group creation, and init_process_group failed."""
    code = (
        "import torch, torch.distributed as dist, fr_backend\n"
        "dist.init_process_group('frnccl')\n"
        "dist.all_reduce(torch.ones(2))\n"
        "print('attempt', fr_backend.trace_entries(symbolize=False)['attempt'])\n"
        "dist.destroy_process_group()\n"
    )
    res = python_c(code, {"TORCHELASTIC_RESTART_COUNT": "two"})
    assert res.returncode == 0 and "attempt 0" in res.stdout, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if "TORCHELASTIC_RESTART_COUNT" in ln]
    assert len(lines) == 1 and "'two' is not a restart count" in lines[0], res.stderr
