"""CLI: exit codes, JSON shape, one-line errors, merged trace."""

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

from fr_backend.analyzer.cli import main
from fr_backend.analyzer.synth import Job

PYTHONPATH = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "python"))


def cli_subprocess(*args):
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", PYTHONPATH)
    return subprocess.run([sys.executable, "-m", "fr_backend.analyzer", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=120)


def cli(*args):
    """In-process run of the same entry point (a fresh interpreter costs seconds here)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    ok = Job(4)
    for _ in range(3):
        ok.collective()
    hang = Job(4)
    for _ in range(3):
        hang.collective()
    hang.collective(ranks=[0, 1, 3], state="started")
    return {"ok": ok.write(root / "ok"), "hang": hang.write(root / "hang"),
            "partial": ok.write(root / "partial", ranks=[0, 1, 2]), "root": root}


def test_exit_0_healthy(dumps):
    p = cli(dumps["ok"])
    assert p.returncode == 0, p.stderr
    assert "No problems found" in p.stdout


def test_exit_1_and_culprit_first(dumps):
    p = cli_subprocess(dumps["hang"])  # the real module entry point, once
    assert p.returncode == 1
    first = p.stdout.split("ROOT CAUSE:", 1)[1].splitlines()[0]
    assert "rank 2" in first and "not_joined" in first


def test_json_shape(dumps):
    p = cli("analyze", dumps["hang"], "--json")
    assert p.returncode == 1
    out = json.loads(p.stdout)
    assert set(out) >= {"world_size", "ranks_found", "ranks_missing", "findings"}
    assert (out["world_size"], out["ranks_found"], out["ranks_missing"]) == (4, [0, 1, 2, 3], [])
    f = out["findings"][0]
    assert set(f) >= {"kind", "pg", "pg_desc", "collective_seq_id", "op", "culprit_ranks", "detail"}
    assert (f["kind"], f["pg"], f["pg_desc"], f["collective_seq_id"], f["op"], f["culprit_ranks"]) == \
        ("not_joined", "0", "default_pg", 4, "all_reduce", [2])


def test_informational_only_exits_0(dumps):
    p = cli(dumps["partial"], "--json")
    assert p.returncode == 0
    out = json.loads(p.stdout)
    assert out["ranks_missing"] == [3]
    assert [f["kind"] for f in out["findings"]] == ["missing_dump"]


def test_pg_filter(dumps):
    p = cli(dumps["hang"], "--json", "--pg", "nope")
    assert json.loads(p.stdout)["findings"] == [] and p.returncode == 0


def _junk(r):
    (r / "junk").mkdir()
    (r / "junk" / "x_0").write_bytes(b"\x80\x02}q")
    return r / "junk"


@pytest.mark.parametrize("setup,needle", [
    (lambda r: r / "does-not-exist", "no such file"),
    (lambda r: (r / "empty").mkdir() or r / "empty", "no dump files"),
    (lambda r: _junk(r), "no usable dump"),
])
def test_bad_input_exit_2_one_line(tmp_path, setup, needle):
    p = cli(setup(tmp_path))
    assert p.returncode == 2
    assert needle in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert p.stdout == ""


def test_bad_input_subprocess_has_no_traceback(tmp_path):
    p = cli_subprocess(tmp_path / "nope")
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "no such file" in p.stderr


def test_no_progress_bar_when_not_a_tty(dumps):
    p = cli(dumps["hang"])
    assert "loading dumps" not in p.stderr


def test_progress_bar_on_tty():
    import io

    from fr_backend.analyzer.progress import make_progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    s = Tty()
    upd = make_progress(stream=s)
    for i in range(1, 101):
        upd(i, 100)
    assert "loading dumps [" in s.getvalue() and "100/100" in s.getvalue()
    assert make_progress(stream=io.StringIO()) is None


def test_register_wires_subcommands():
    import argparse

    from fr_backend.analyzer.cli import register

    p = argparse.ArgumentParser()
    register(p.add_subparsers(dest="cmd"))
    for argv in (["analyze", "x", "--json"], ["trace", "x", "-o", "t.json"], ["report", "x", "-o", "r.html"]):
        ns = p.parse_args(argv)
        assert callable(ns.func)


def test_merged_trace(dumps, tmp_path):
    out = tmp_path / "merged.json"
    p = cli("trace", dumps["hang"], "-o", out)
    assert p.returncode == 0, p.stderr
    t = json.loads(out.read_text())
    ev = t["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(procs) == [0, 1, 2, 3]
    assert "CULPRIT" in procs[2] and all("CULPRIT" not in procs[r] for r in (0, 1, 3))
    threads = {(e["pid"], e["tid"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert len(threads) == 4
    slices = [e for e in ev if e["ph"] == "X"]
    assert len(slices) == 15  # 4 ranks x 3 + 3 waiting
    flows = [e for e in ev if e["ph"] in ("s", "t", "f")]
    ids = {e["id"] for e in flows}
    assert len(ids) == 4  # one arrow chain per collective seen by 2+ ranks
    for i in ids:
        phs = sorted(e["ph"] for e in flows if e["id"] == i)
        assert phs.count("s") == 1 and phs.count("f") == 1
    assert any(e["ph"] == "i" and e["pid"] == 2 and "CULPRIT" in e["name"] for e in ev)
    assert t["otherData"]["culprits"] == {"2": "not_joined (pg 0 seq 4)"}


def _sub_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PYTHONPATH, env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


@pytest.mark.parametrize("make", ["fifo", "/dev/urandom", "/dev/zero"])
def test_non_regular_file_is_refused_not_read(tmp_path, make):
    """A FIFO would block the open forever, /dev/urandom and /dev/zero never end: one line naming the file, exit 2."""
    if make == "fifo":
        path = str(tmp_path / "frnccl_rank_0")
        os.mkfifo(path)
    else:
        if not os.path.exists(make):
            pytest.skip(f"no {make}")
        path = make
    p = subprocess.run([sys.executable, "-m", "fr_backend.analyzer", path], capture_output=True, text=True,
                       env=_sub_env(), timeout=60)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert path in p.stderr and "not a regular file" in p.stderr


def test_fifo_among_good_dumps_is_named_and_the_rest_analysed(dumps, tmp_path):
    fifo = tmp_path / "frnccl_rank_9"
    os.mkfifo(fifo)
    files = [os.path.join(dumps["hang"], "pickle", f"frnccl_rank_{r}") for r in range(4)]
    p = cli(*files, fifo, "--json")
    assert p.returncode == 1
    out = json.loads(p.stdout)
    assert [u["path"] for u in out["unreadable_files"]] == [str(fifo)]
    assert out["findings"][0]["culprit_ranks"] == [2]


def test_read_is_bounded(tmp_path, monkeypatch):
    from fr_backend.analyzer import dumpfile
    from fr_backend.analyzer import load as L

    p = tmp_path / "frnccl_rank_0"
    p.write_bytes(b"{" + b" " * 5000)
    monkeypatch.setattr(dumpfile, "MAX_DUMP_BYTES", 1000)
    with pytest.raises(L.DumpError, match="too large"):
        L.load_dump(p)


def test_undecodable_names_and_lone_surrogates_never_crash(tmp_path):
    """A folder name with a non-UTF-8 byte, and a JSON dump whose stacks hold a lone surrogate, under a strict
    UTF-8 stdout: the text report, the JSON, the trace and the HTML report are all written, no traceback."""
    j = Job(4)
    for _ in range(3):
        j.collective()
    j.set_stacks(3, 'Thread 0x1:\n  File "a.py", line 1 in f\udc80\n')
    j.collective(ranks=[0, 1, 2], state="started")
    root = os.fsdecode(os.fsencode(str(tmp_path)) + b"/dumps_\xff")
    inc = j.write(root, "json")
    env = _sub_env(PYTHONIOENCODING="utf-8")
    for args, rc in (([inc], 1), ([inc, "--json"], 1), (["report", inc, "-o", os.path.join(root, "r.html")], 0),
                     (["trace", inc, "-o", os.path.join(root, "t.json")], 0)):
        p = subprocess.run([sys.executable, "-m", "fr_backend.analyzer", *args], capture_output=True, env=env,
                           timeout=120)
        err = p.stderr.decode("utf-8", "replace")
        assert p.returncode == rc and "Traceback" not in err, (args, err)
        if args[-1] == inc:
            assert b"rank 3" in p.stdout and b"dumps_" in p.stdout
    page = open(os.path.join(root, "r.html"), encoding="utf-8").read()
    assert "\\udc80" in page and "Root cause: rank 3" in page


def test_frnccl_command_imports_no_torch(dumps, tmp_path):
    """The `frnccl` command's analyzer imports no torch, so nothing torch says while it imports reaches the
    command's output: here numpy cannot be imported, which makes torch warn "Failed to initialize NumPy" at every
    start (as on a fresh venv before install.sh installed numpy)."""
    broken = tmp_path / "site" / "numpy"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken.parent), PYTHONPATH]), "PYTHONWARNINGS": "always"}
    torch_alone = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env=env,
                                 timeout=120)
    assert "Failed to initialize NumPy" in torch_alone.stderr, "the broken numpy does not make torch warn"
    code = ("import sys\nfrom fr_backend.cli import main\nrc = main(sys.argv[1:])\n"
            "print('torch imported:', 'torch' in sys.modules)\nsys.exit(rc)\n")
    p = subprocess.run([sys.executable, "-c", code, "analyze", str(dumps["hang"])], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 1 and "ROOT CAUSE:" in p.stdout, p.stdout + p.stderr
    assert "torch imported: False" in p.stdout, p.stdout
    assert "NumPy" not in p.stderr and "Warning" not in p.stderr, p.stderr


class _ClosedPipe(io.StringIO):
    """stdout whose reader went away (head, less quit)."""

    def write(self, s):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_reader_gone_still_exits_with_the_verdict(dumps, json_flag):
    """`frnccl analyze DIR | head -1` on a hang: the reader going away must not turn the verdict into exit 0."""
    with contextlib.redirect_stdout(_ClosedPipe()), contextlib.redirect_stderr(io.StringIO()):
        assert main([str(dumps["hang"]), *json_flag]) == 1
    with contextlib.redirect_stdout(_ClosedPipe()), contextlib.redirect_stderr(io.StringIO()):
        assert main([str(dumps["ok"]), *json_flag]) == 0


def test_reader_gone_before_the_output_subprocess(dumps):
    """The same through a real pipe closed before the analyzer writes: exit 1, no 'Exception ignored' at exit."""
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", PYTHONPATH)
    p = subprocess.Popen([sys.executable, "-m", "fr_backend.analyzer", str(dumps["hang"]), "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 1, err
    assert "Exception ignored" not in err and "Traceback" not in err, err
