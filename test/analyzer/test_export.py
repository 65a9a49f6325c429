"""`frnccl export --torch SRC OUT`: torch-readable pickles from any dump, never written over or through a link.
(The export of a real job's dump read by torch's fr_trace: test/test_recorder.py, test_torch_fr_trace_reads_healthy_dump.)"""

from __future__ import annotations

import os
import pickle

import pytest

from fr_backend.analyzer.load import load_dump
from fr_backend.analyzer.synth import Job
from fr_backend.cli import main


def _job() -> Job:
    j = Job(3)
    for _ in range(5):
        j.collective("all_reduce")
    j.p2p(0, 1)
    return j


def _incident(tmp_path, fmt: str) -> str:
    root = _job().write(tmp_path / "dumps", fmt)
    return str(root)


def _export(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["export", "--torch", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("fmt", ["compact", "pickle", "json", "torch"])
def test_every_format_exports_the_same_dumps(tmp_path, capsys, fmt):
    src = _incident(tmp_path, fmt)
    out = tmp_path / "torch"
    code, stdout, err = _export(capsys, src, str(out))
    assert code == 0 and err == "", (stdout, err)
    assert sorted(os.listdir(out)) == ["frnccl_rank_0", "frnccl_rank_1", "frnccl_rank_2"]
    assert "wrote 3 torch pickles" in stdout and "fr_trace" in stdout
    for r in range(3):
        with open(out / f"frnccl_rank_{r}", "rb") as f:
            got = pickle.load(f)  # a plain pickle: no frnccl class needed to read it
        assert got.get("rank", r) == r and len(got["entries"]) == (6 if r < 2 else 5)  # rank 2 has no p2p
        assert all(isinstance(e["process_group"], tuple) for e in got["entries"])  # as torch's own dumps hold it
        assert got["entries"] == load_dump(out / f"frnccl_rank_{r}")["entries"]
        assert got["pg_config"]["0"]["ranks"] == "[0, 1, 2]"  # torch's string, made from frnccl's members text


def test_an_existing_file_is_not_replaced(tmp_path, capsys):
    src = _incident(tmp_path, "compact")
    out = tmp_path / "torch"
    out.mkdir()
    (out / "frnccl_rank_1").write_text("earlier")
    code, _, err = _export(capsys, src, str(out))
    assert code == 2 and err.count("\n") == 1 and "frnccl_rank_1 already exists; not replaced" in err, err
    assert sorted(os.listdir(out)) == ["frnccl_rank_1"] and (out / "frnccl_rank_1").read_text() == "earlier"


def test_links_are_not_followed(tmp_path, capsys):
    src = _incident(tmp_path, "compact")
    target = tmp_path / "elsewhere"
    target.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("secret")
    linked_out = tmp_path / "linked"
    linked_out.symlink_to(target)
    code, _, err = _export(capsys, src, str(linked_out))
    assert code == 2 and err.count("\n") == 1 and "symbolic link" in err, err
    assert os.listdir(target) == []
    out = tmp_path / "torch"
    out.mkdir()
    (out / "frnccl_rank_2").symlink_to(victim)
    code, _, err = _export(capsys, src, str(out))
    assert code == 2 and "frnccl_rank_2 already exists; not replaced" in err, err
    assert victim.read_text() == "secret" and sorted(os.listdir(out)) == ["frnccl_rank_2"]


def test_an_unreadable_dump_is_skipped_and_named(tmp_path, capsys):
    src = _incident(tmp_path, "compact")
    bad = os.path.join(src, "compact", "frnccl_rank_1.json.gz")
    with open(bad, "r+b") as f:
        f.truncate(40)
    out = tmp_path / "torch"
    code, stdout, err = _export(capsys, src, str(out))
    assert code == 1, (stdout, err)
    assert err.count("\n") == 1 and "frnccl_rank_1.json.gz" in err and "skipped" in err, err
    assert sorted(os.listdir(out)) == ["frnccl_rank_0", "frnccl_rank_2"]


@pytest.mark.parametrize("case", ["missing", "empty", "not_dumps"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case):
    src = tmp_path / "src"
    if case == "empty":
        src.mkdir()
    elif case == "not_dumps":
        (src / "compact").mkdir(parents=True)
        (src / "compact" / "frnccl_rank_0.json.gz").write_bytes(b"\x1f\x8bnot gzip")
    out = tmp_path / "torch"
    code, stdout, err = _export(capsys, str(src), str(out))
    assert code == 2 and stdout == "" and err.count("\n") in (1, 2) and "Traceback" not in err, err
    assert all(line.startswith("frnccl export: ") for line in err.splitlines()), err
    assert not out.exists() or os.listdir(out) == []


@pytest.mark.parametrize("content", [
    {"format": "frnccl", "rank": 1, "pg_config": {}, "entries": 5},  # JSON: entries not a list
    {"format": "frnccl", "rank": 1, "pg_config": {}, "entries": 1.5},
])
def test_a_malformed_rank_is_skipped_not_the_whole_export(tmp_path, capsys, content):
    import json

    src = _incident(tmp_path, "json")
    with open(os.path.join(src, "json", "frnccl_rank_1.json"), "w") as f:
        json.dump(content, f)
    _rank_1_skipped(tmp_path, capsys, src, "skipped")


@pytest.mark.parametrize("text", ["0:9999999999", "0:3:0", "zz"])
def test_bad_members_text_skips_that_rank(tmp_path, capsys, text):
    """A members text that names too many ranks or is no text at all: that rank is skipped with one line,
    at once, and the others exported."""
    import json

    src = _incident(tmp_path, "json")
    path = os.path.join(src, "json", "frnccl_rank_1.json")
    with open(path) as f:
        d = json.load(f)
    d["pg_config"]["0"]["members"] = text
    with open(path, "w") as f:
        json.dump(d, f)
    _rank_1_skipped(tmp_path, capsys, src, "pg_config members")


def _rank_1_skipped(tmp_path, capsys, src: str, why: str) -> None:
    """Exporting ``src`` skips rank 1's JSON dump in one line saying ``why``, and writes the others."""
    out = tmp_path / "torch"
    code, stdout, err = _export(capsys, src, str(out))
    assert code == 1, (stdout, err)
    assert err.count("\n") == 1 and "frnccl_rank_1.json" in err and why in err, err
    assert sorted(os.listdir(out)) == ["frnccl_rank_0", "frnccl_rank_2"]


def test_a_trailing_slash_does_not_follow_a_link(tmp_path, capsys):
    """open("link/", O_NOFOLLOW) resolves the link: the trailing slash names the folder it points to."""
    src = _incident(tmp_path, "compact")
    target = tmp_path / "elsewhere"
    target.mkdir()
    linked_out = tmp_path / "linked"
    linked_out.symlink_to(target)
    code, _, err = _export(capsys, src, str(linked_out) + "/")
    assert code == 2 and err.count("\n") == 1 and "symbolic link" in err, err
    assert os.listdir(target) == []


def test_a_value_nested_deeper_than_pickle_can_skips_that_rank(tmp_path, capsys):
    """json.loads accepts ~990 levels; pickle.dumps of the row form stops earlier (RecursionError)."""
    import gzip
    import json

    src = _incident(tmp_path, "compact")
    path = os.path.join(src, "compact", "frnccl_rank_1.json.gz")
    obj = json.loads(gzip.decompress(open(path, "rb").read()))
    frames = obj["entries"]["columns"]["frames"]
    frames["table"].append(json.loads("[" * 900 + "]" * 900))
    frames["index"] = [len(frames["table"]) - 1] * len(frames["index"])
    with open(path, "wb") as f:
        f.write(gzip.compress(json.dumps(obj).encode()))
    assert load_dump(path)["entries"]  # the reader takes it: only the pickle cannot
    out = tmp_path / "torch"
    code, stdout, err = _export(capsys, src, str(out))
    try:
        pickle.dumps(frames["table"][-1])
    except RecursionError:
        pass
    else:  # Python 3.12's C pickler is bounded by the C stack, not the recursion limit: the rank exports
        assert code == 0 and sorted(os.listdir(out)) == ["frnccl_rank_0", "frnccl_rank_1", "frnccl_rank_2"], err
        return
    assert code == 1, (stdout, err)
    assert err.count("\n") == 1 and "frnccl_rank_1.json.gz" in err and "RecursionError" in err, err
    assert sorted(os.listdir(out)) == ["frnccl_rank_0", "frnccl_rank_2"]


@pytest.mark.parametrize("rank", [10**300, 1 << 31])
def test_a_rank_past_any_job_is_taken_from_the_file_name(tmp_path, capsys, rank):
    """A 300-digit rank made a file name too long: ENAMETOOLONG ended the export with nothing written."""
    from fr_backend import compact

    src = _incident(tmp_path, "compact")
    path = os.path.join(src, "compact", "frnccl_rank_2.json.gz")
    d = load_dump(path)
    d["rank"] = rank
    with open(path, "wb") as f:
        f.write(compact.encode(d))
    out = tmp_path / "torch"
    code, stdout, err = _export(capsys, src, str(out))
    assert code == 0 and err == "", (stdout, err)
    assert sorted(os.listdir(out)) == ["frnccl_rank_0", "frnccl_rank_1", "frnccl_rank_2"]


def test_each_rank_is_written_before_the_next_is_read(tmp_path, monkeypatch):
    """Memory holds one rank's dump: all of them held until the end would be ~80 GB for 16,384 ranks of 5 MB."""
    from fr_backend import export

    src = _incident(tmp_path, "compact")
    events: list[str] = []
    real_load, real_write = export.load_dump, export._write_new
    monkeypatch.setattr(export, "load_dump", lambda p: (events.append("read"), real_load(p))[1])
    monkeypatch.setattr(export, "_write_new", lambda *a: (events.append("write"), real_write(*a))[1])
    got = export.export_torch(src, str(tmp_path / "torch"))
    assert len(got.written) == 3 and events == ["read", "write"] * 3, events
