"""Dump files written to hurt the reader: a pickle bomb of shared references, groups only some ranks
describe, and text that a terminal would act on. Reading them must never hang, crash (exit 1 means
findings, never a traceback) or draw what the file wants the reader to see."""

import contextlib
import io
import json
import os
import pickle
import subprocess
import sys
import time

import pytest

from fr_backend.analyzer.cli import main
from fr_backend.analyzer.load import DumpError, load_dump
from fr_backend.analyzer.report import run, to_text
from fr_backend.analyzer.synth import Job

PYTHONPATH = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "python"))


def cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def cli_subprocess(*args, timeout=60):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PYTHONPATH, env.get("PYTHONPATH", "")) if p)
    env["PYTHONWARNINGS"] = "ignore"  # torch's import may warn (no numpy): not the analyzer's output
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "fr_backend.analyzer", *map(str, args)], capture_output=True,
                       text=True, env=env, timeout=timeout, check=False)
    return p, time.monotonic() - t


def job(world=4):
    j = Job(world)
    tp = j.new_pg("1", [0, 1], "tp")
    for _ in range(3):
        j.collective()
    j.collective("_all_gather_base", tp, sizes=[[4]], out_sizes=[[8]])
    j.p2p(0, 3)
    j.collective(ranks=[0, 1, 3], state="started")  # rank 2 never joins
    return j


def write(folder, rank, d, fmt="pickle"):
    os.makedirs(folder, exist_ok=True)
    if fmt == "pickle":
        path = os.path.join(folder, f"frnccl_rank_{rank}")
        with open(path, "wb") as f:
            pickle.dump(d, f, protocol=2)
    else:
        path = os.path.join(folder, f"frnccl_rank_{rank}.json")
        with open(path, "w") as f:
            json.dump(d, f)
    return path


# --------------------------------------------------------------------------- 6. bounded reading


def bomb(depth):
    """A list that pickles to ~6 bytes a level and unfolds to 2**depth leaves."""
    x = ["x"]
    for _ in range(depth):
        x = [x, x]
    return x


# Every place a reader follows a value: header text, sizes, dtypes, names, ids, frames, group descriptions.
BOMB_PLACES = {
    "hostname": lambda d, b: d.__setitem__("hostname", b),
    "dump_detail": lambda d, b: d.__setitem__("dump_detail", b),
    "input_sizes": lambda d, b: [e.__setitem__("input_sizes", b) for e in d["entries"]],
    "output_dtypes": lambda d, b: d["entries"][-1].__setitem__("output_dtypes", b),
    "profiling_name": lambda d, b: d["entries"][0].__setitem__("profiling_name", b),
    "pg_id": lambda d, b: d["entries"][0].__setitem__("pg_id", b),
    "frame_name": lambda d, b: d["entries"][-1]["frames"][0].__setitem__("name", b),
    "pg_desc": lambda d, b: d["pg_config"]["0"].__setitem__("desc", b),
    "process_group": lambda d, b: d["entries"][0].__setitem__("process_group", ("0", b)),
}


def test_pickle_bomb_in_any_field_is_refused_fast(tmp_path):
    """A 4-5 KB pickle whose shared lists unfold to 2**40 values, in each field a reader follows, one file a
    field: each is refused with one line naming the bomb, the good ranks are analysed, all within seconds."""
    j = job(len(BOMB_PLACES) + 2)
    folder = tmp_path / "inc" / "pickle"
    for r in (0, 1):
        write(folder, r, j.dump(r))
    bombed = {}
    for r, (place, put) in enumerate(BOMB_PLACES.items(), start=2):
        d = j.dump(r)
        put(d, bomb(40))
        bombed[place] = write(folder, r, d)
        assert os.path.getsize(bombed[place]) < 8000, place
    p, took = cli_subprocess(tmp_path / "inc", "--json", timeout=90)
    assert p.returncode in (0, 1) and "Traceback" not in p.stderr, p.stderr[-2000:]
    out = json.loads(p.stdout)
    reasons = {u["path"]: u["reason"] for u in out["unreadable_files"]}
    for place, path in bombed.items():
        assert path in reasons and "pickle bomb" in reasons[path], (place, reasons)
    assert out["ranks_found"] == [0, 1]
    assert took < 60, f"took {took:.0f} s"


def test_pickle_bomb_alone_exits_2_with_one_line(tmp_path):
    d = job().dump(1)
    d["hostname"] = bomb(24)  # the case: 2**24 leaves, 34 s and 2.5 GB when followed
    path = write(tmp_path, 1, d)
    p, took = cli_subprocess(path, timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "no usable dump" in lines[0] and "pickle bomb" in lines[0], p.stderr
    assert took < 30, f"took {took:.0f} s"


def test_bomb_in_an_entry_field_no_reader_follows_goes_with_the_raw_tree(tmp_path):
    """The command line's first read of a pickle does not measure the entries (a quarter of a torch dump's read):
    a bomb under an entry key that nothing reads costs nothing there, and the rank is analysed; a library read,
    which hands the whole dict to its caller, still refuses the file by name."""
    j = job()
    folder = tmp_path / "inc" / "pickle"
    for r in range(4):
        d = j.dump(r)
        if r == 1:
            for e in d["entries"]:
                e["unread"] = bomb(40)
        write(folder, r, d)
    p, _ = cli_subprocess(tmp_path / "inc", "--json", timeout=60)
    out = json.loads(p.stdout)
    assert out["unreadable_files"] == [] and out["ranks_found"] == [0, 1, 2, 3], out["unreadable_files"]
    assert "not_joined" in p.stdout and len(p.stdout) < 100_000
    with pytest.raises(DumpError, match="pickle bomb"):
        load_dump(folder / "frnccl_rank_1")


def test_bomb_refused_within_its_bound(tmp_path):
    """What is done before refusing is bounded by the file's size, not by what it would unfold to."""
    for depth in (24, 60):
        path = tmp_path / f"frnccl_rank_{depth}"
        path.write_bytes(pickle.dumps({"entries": [], "pg_config": {}, "x": bomb(depth)}, protocol=2))
        t = time.monotonic()
        with pytest.raises(DumpError, match="pickle bomb"):
            load_dump(path)
        assert time.monotonic() - t < 10


def test_deep_nesting_refused(tmp_path):
    """100,000 nested lists (written by hand: no pickler writes them): refused in one line."""
    n = 100_000
    data = (b"\x80\x02}(X\x07\x00\x00\x00entries]X\x09\x00\x00\x00pg_config}X\x01\x00\x00\x00x"
            + b"]" * n + b"a" * (n - 1) + b"u.")
    path = tmp_path / "frnccl_rank_0"
    path.write_bytes(data)
    with pytest.raises(DumpError, match="nested too deep") as err:
        load_dump(path)
    assert "\n" not in str(err.value)


def _rss_peak_kib(reset: bool = False) -> int:
    if reset:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # a fresh peak-RSS mark (Linux 4.0+)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's peak-RSS reset")
@pytest.mark.parametrize("data", [
    b"\x80\x02}r\x00\x00\x50\x07(X\x07\x00\x00\x00entries]u.",  # LONG_BINPUT 122683392: a 1.9 GB memo table
    b"\x80\x02]r\xff\xff\xff\x7f.",  # LONG_BINPUT 2**31-1: 32 GB
    b"\x80\x00T\x00\x00\x00@",  # BINSTRING of 1 GiB in a 7-byte file
    b"\x80\x03B\x00\x00\x00\xf0",  # BINBYTES of 3.75 GiB
], ids=["memo-1.9GB", "memo-32GB", "binstring-1GiB", "binbytes-3.75GiB"])
def test_memory_asked_by_a_few_bytes_is_refused(tmp_path, data):
    """A memo index or a length field far past the file: refused in one line, resident memory unmoved."""
    path = tmp_path / "frnccl_rank_0"
    path.write_bytes(data)
    before = _rss_peak_kib(reset=True)
    with pytest.raises(DumpError, match="takes more memory than a dump of") as err:
        load_dump(path)
    assert (_rss_peak_kib() - before) < 100 << 10, "resident memory grew by more than 100 MiB"
    assert "\n" not in str(err.value)


def test_command_line_workers_keep_the_address_space_limit(tmp_path):
    """The command line reads in worker processes: each keeps the limit (the memo index asks for 1.9 GB: refused
    for memory, not loaded) next to good ranks whose verdict stands."""
    j = job()
    folder = tmp_path / "inc" / "pickle"
    for r in range(3):
        write(folder, r, j.dump(r))
    (folder / "frnccl_rank_3").write_bytes(b"\x80\x02}r\x00\x00\x50\x07(X\x07\x00\x00\x00entries]u.")
    p, _ = cli_subprocess(tmp_path / "inc", "--json", timeout=60)
    out = json.loads(p.stdout)
    assert [(u["path"], u["reason"].split(":")[0]) for u in out["unreadable_files"]] == [
        (str(folder / "frnccl_rank_3"), "refused")], out["unreadable_files"]
    assert "takes more memory than a dump of 24 bytes" in out["unreadable_files"][0]["reason"]
    assert out["ranks_found"] == [0, 1, 2] and p.returncode == 1


def test_library_reads_leave_the_address_space_limit_alone(tmp_path, monkeypatch):
    """fr_backend.load_dump() and trace_entries() may run inside a training job, whose other threads must
    never see an allocation fail: only the analyzer's command line lowers RLIMIT_AS while it unpickles."""
    import resource

    from fr_backend.analyzer.load import guard_address_space

    calls = []
    monkeypatch.setattr(resource, "setrlimit", lambda *a: calls.append(a))
    path = tmp_path / "frnccl_rank_0"
    path.write_bytes(pickle.dumps(job().dump(0)))
    guard_address_space(False)
    load_dump(path)
    assert calls == [], "a library read changed the process's address-space limit"
    guard_address_space(True)
    load_dump(path)
    assert calls, "the analyzer's guarded read did not lower the limit"


def test_plain_dumps_unfold_well_within_the_bound(tmp_path):
    """Shared strings and lists of a plain dump (Python's pickler shares lists, frnccl's writer strings)."""
    d = job().dump(0)
    frames = [{"name": f"fn{i}", "filename": "/very/long/path/to/a/site-packages/module/file.py" * 3,
               "line": i} for i in range(30)]
    for e in d["entries"]:
        e["frames"] = frames  # one list, referenced by every entry
    path = write(tmp_path, 0, d)
    assert load_dump(path)["rank"] == 0


@pytest.mark.parametrize("field,value", [("hostname", ["h", {"a": 1}]), ("incident_id", {"id": 1}),
                                         ("dump_reason", 7), ("version", 3), ("dump_detail", "d" * 100_000)])
def test_header_fields_become_bounded_text(tmp_path, field, value):
    d = job().dump(0)
    d[field] = value
    for fmt in ("pickle", "json"):
        got = load_dump(write(tmp_path / fmt, 0, d, fmt))[field]
        assert type(got) is str and len(got) <= 4100, (fmt, got[:80])
        if isinstance(value, (list, dict)):
            assert got == "", (fmt, got)
        elif isinstance(value, int):
            assert got == str(value)


def test_group_names_become_text(tmp_path):
    d = job().dump(0)
    d["pg_config"]["0"]["desc"] = ["default_pg"]
    d["pg_status"]["0"]["process_group"] = {"x": 1}
    got = load_dump(write(tmp_path, 0, d))
    assert got["pg_config"]["0"]["desc"] == "" and got["pg_status"]["0"]["process_group"] == ""


def _text(b):
    return b"X" + len(b).to_bytes(4, "little") + b


def _shared_tuples(depth):
    """Pickle opcodes (protocol 2) of t_depth, where t_0 = ("x",) and t_n = (t_n-1, t_n-1): 5 bytes a level
    (each level refers to the one below through the memo). Hashing it hashes 2**depth leaves: no pickler
    writes it (pickling would hash it first), so it is written by hand."""
    return _text(b"x") + b"\x85q\x00" + b"h\x00\x86q\x00" * depth


def hash_bomb(depth, as_set=False):
    """A dump whose one dict key (or set member, protocol 4's FROZENSET) is _shared_tuples(depth): the C
    unpickler hashes it while it builds the dict (or set), before load() returns to any Python code."""
    head = (b"\x80\x04" if as_set else b"\x80\x02") + b"}(" + _text(b"entries") + b"]" + _text(b"pg_config") + b"}"
    if as_set:
        return head + _text(b"k") + b"(" + _shared_tuples(depth) + b"\x91u."
    return head + _text(b"k") + b"}" + _shared_tuples(depth) + b"K\x01su."


@pytest.mark.parametrize("as_set", [False, True])
def test_hash_bomb_is_shared_tuples(as_set):
    """What the tests below rely on: 170-260 bytes that unpickle to a key (a set member) whose every level is
    one tuple twice (hashing it at depth 40 takes hours: each level doubles the time)."""
    from fr_backend.analyzer.load import safe_loads

    assert len(hash_bomb(22)) < 180 and len(hash_bomb(40, as_set)) < 270
    (key,) = safe_loads(hash_bomb(6, as_set))["k"]
    for _ in range(6):
        assert type(key) is tuple and len(key) == 2 and key[0] is key[1]
        key = key[0]
    assert key == ("x",)


def hash_bombed(root, kinds=("dict key", "set member")):
    """Four good ranks (rank 2 never joins the last collective) and, from rank 4 on, one 250-byte file per kind
    whose dict key or set member is shared tuples nested 40 deep: 2**40 hash steps, hours of CPU each."""
    j = job(4 + len(kinds))
    folder = root / "inc" / "pickle"
    for r in range(4):
        write(folder, r, j.dump(r))
    bombs = []
    for r, kind in enumerate(kinds, start=4):
        bombs.append(folder / f"frnccl_rank_{r}")
        bombs[-1].write_bytes(hash_bomb(40, as_set=kind == "set member"))
    return root / "inc", bombs


def refused_line(path, cpu_s):
    return (f"unreadable: {path}: refused: reading it took more than {cpu_s} s of CPU, far more than a dump of "
            f"{os.path.getsize(path)} bytes needs (a hostile or damaged pickle)")


def test_hash_bomb_among_good_ranks_is_refused_within_the_cpu_bound(tmp_path):
    """`frnccl analyze` refuses the bomb in one line naming the file, after its 5 s of CPU, and gives the
    verdict of the others (rank 2 never joined). Before, it never finished."""
    inc, bombs = hash_bombed(tmp_path, kinds=("dict key",))
    p, took = cli_subprocess(inc, timeout=60)
    assert p.returncode == 1 and not p.stderr, (p.returncode, p.stderr[-2000:])
    assert took < 45, f"took {took:.0f} s"
    for path in bombs:
        assert refused_line(path, 5) in p.stdout.splitlines(), p.stdout
    assert "ROOT CAUSE: rank 2 - not_joined" in p.stdout, p.stdout


@pytest.fixture
def one_second_per_file(monkeypatch):
    """The per-file CPU bound at 1 s (the bomb tests in this process need not wait the default 5 s)."""
    from fr_backend.analyzer import workers

    monkeypatch.setattr(workers, "FILE_CPU_BASE_S", 1)


def test_hash_bomb_in_report_and_trace(tmp_path, one_second_per_file):
    """`report` names each bomb (dict key, set member) as unreadable and gives the verdict; `trace` holds the
    four good ranks."""
    inc, bombs = hash_bombed(tmp_path)
    rc, out, err = cli("report", inc, "-o", tmp_path / "r.html")
    assert rc == 0 and not err, (rc, out, err)
    page = (tmp_path / "r.html").read_text()
    for path in bombs:
        assert f"unreadable: {path}: refused: reading it took more than 1 s of CPU" in page
    assert "Root cause: rank 2" in page
    bombs[1].unlink()  # one bomb is enough to show that trace reads in workers too
    rc, out, err = cli("trace", inc, "-o", tmp_path / "t.json")
    assert rc == 0 and not err and out.endswith(" events from 4 ranks\n"), (rc, out, err)
    assert json.loads((tmp_path / "t.json").read_text())["otherData"]["culprits"] == {"2": "not_joined (pg 0 seq 4)"}


def test_hash_bomb_alone_exits_2_with_one_line(tmp_path, one_second_per_file):
    """One file, the bomb: it is read in a worker too (exit 2, no usable dump, one line naming why)."""
    path = tmp_path / "frnccl_rank_0"
    path.write_bytes(hash_bomb(40))
    rc, out, err = cli(path)
    assert rc == 2 and not out, (rc, out, err)
    assert err == (f"frnccl analyze: error: {path}: no usable dump (frnccl_rank_0: refused: reading it took more "
                   f"than 1 s of CPU, far more than a dump of {len(hash_bomb(40))} bytes needs (a hostile or damaged "
                   "pickle))\n"), err


# --------------------------------------------------------------------------- 7. members some ranks do not give


def test_group_config_missing_on_one_rank(tmp_path):
    """Rank 0's dump lacks pg '1' (the tp group) in pg_config, rank 1's has it: the members come from rank 1,
    and analyze, report and trace all finish (it was a TypeError, exit 1)."""
    j = job()
    folder = tmp_path / "inc" / "pickle"
    for r in range(4):
        d = j.dump(r)
        if r == 0:
            del d["pg_config"]["1"]
        write(folder, r, d)
    a = run([str(tmp_path / "inc")], jobs=1)
    assert a.res.ranks[0].pgs["1"].ranks == (0, 1)
    assert any(n.startswith("pg 1: rank 0 ") and "as the other dumps give them" in n for n in a.res.notes), a.res.notes
    rc, out, err = cli("analyze", tmp_path / "inc")
    assert rc == 1 and "ROOT CAUSE: rank 2" in out and not err, err
    rc, out, err = cli("report", tmp_path / "inc", "-o", tmp_path / "r.html")
    assert rc == 0 and not err, err
    rc, out, err = cli("trace", tmp_path / "inc", "-o", tmp_path / "t.json")
    assert rc == 0 and not err, err


@pytest.mark.parametrize("command", ["analyze", "report", "trace"])
def test_unexpected_exception_exits_2_in_one_line(tmp_path, monkeypatch, command):
    """Whatever goes wrong inside the analysis: exit 2 (never 1, which means findings), one line, no traceback."""
    from fr_backend.analyzer import report

    def boom(*a, **k):
        raise TypeError("'<=' not supported between instances of 'set' and 'tuple'\nsecond line")

    monkeypatch.setattr(report, "run", boom)
    path = write(tmp_path, 0, job().dump(0))
    extra = [] if command == "analyze" else ["-o", tmp_path / "out"]
    rc, out, err = cli(command, path, *extra)
    assert rc == 2, (rc, err)
    assert err.count("\n") == 1 and "internal error: TypeError" in err and "Traceback" not in err, err


def test_frnccl_command_exits_2_in_one_line(monkeypatch, capsys):
    """The `frnccl` command itself (dump, config, demo): an unexpected exception is exit 2, one line."""
    pytest.importorskip("torch")
    from fr_backend import cli as frnccl_cli
    from fr_backend import config

    def boom():
        raise RuntimeError("broken\nsecond line")

    monkeypatch.setattr(config, "validate_environment", boom)
    rc = frnccl_cli.main(["config"])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == "frnccl config: internal error: RuntimeError: broken", err


# --------------------------------------------------------------------------- 8. terminal escapes

FORGED = "\x1b[2J\x1b[HROOT CAUSE: rank 7 - forged\r"


def hostile_text_dumps(root):
    """Rank 2 never joins; every string a report shows carries escapes, CR and newlines."""
    j = Job(4)
    tp = j.new_pg("tp\x1b[31m\r\nROOT CAUSE: rank 7 - forged", [0, 1], "desc\x1b]0;title\x07")
    for _ in range(2):
        j.collective()
    j.collective("all_reduce\x1b[2K\rROOT CAUSE: rank 7 - forged", tp)
    j.collective(ranks=[0, 1, 3], state="started")
    folder = root / "20260101-000000-manual-r0" / "pickle"
    for r in range(4):
        d = j.dump(r, incident="20260101-000000-manual-r0")
        d["dump_reason"] = "manual"
        d["dump_time_ns"] += 3600 * 10**9  # an hour into the hang: past the timeout, a fault on a dump by hand too
        d["dump_detail"] = FORGED
        d["hostname"] = "host\x1b[8m"
        write(folder, r, d)
    return root / "20260101-000000-manual-r0"


def assert_inert(text):
    bad = [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f]
    assert not bad, sorted(set(map(repr, bad)))
    assert not any(line.startswith("ROOT CAUSE: rank 7") for line in text.splitlines()), text


def test_control_characters_are_escaped_in_the_text_report(tmp_path):
    inc = hostile_text_dumps(tmp_path)
    rc, out, err = cli("analyze", inc)
    assert rc == 1, err
    assert_inert(out)
    assert_inert(err)
    causes = [line for line in out.splitlines() if line.startswith("ROOT CAUSE:")]
    assert causes == ["ROOT CAUSE: rank 2 - not_joined"], out
    assert "\\x1b[2J\\x1b[HROOT CAUSE: rank 7 - forged\\x0d" in out, out  # shown, escaped, not dropped


def test_control_characters_in_every_text_output(tmp_path):
    """Text report, HTML report, JSON, and the per-file problems and notes: nothing raw."""
    inc = hostile_text_dumps(tmp_path)
    bad = inc / "pickle" / "frnccl_rank_9"
    bad.write_bytes(b"\x80\x02\x1b[2J garbage \r")
    a = run([str(inc)], jobs=1)
    assert_inert(to_text(a))
    rc, _, err = cli("report", inc, "-o", tmp_path / "r.html")
    assert rc == 0, err
    html = (tmp_path / "r.html").read_text()
    assert "\x1b" not in html and "\r" not in html and "<script" not in html
    evidence = html.split("<pre>", 1)[1].split("</pre>", 1)[0]
    assert evidence.count("\n") >= 2 and "\\x0a" not in evidence, evidence  # one evidence line a line
    rc, out, _ = cli("analyze", inc, "--json")
    assert "\x1b" not in out and "\r" not in out and json.loads(out)["findings"]
