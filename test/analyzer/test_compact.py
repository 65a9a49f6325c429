"""The compact encoding (fr_backend/compact.py): what it round-trips, and what it refuses in a hostile file."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fr_backend import compact
from fr_backend.analyzer.load import load_dump
from fr_backend.analyzer.model import DumpError
from fr_backend.analyzer.synth import Job

from conftest import analyse, kinds


def _job() -> Job:
    j = Job(4)
    sub = j.new_pg("1", [0, 1], desc="tp")
    for i in range(30):
        j.collective("all_reduce")
        if i % 3 == 0:
            j.collective("all_gather", pg=sub, sizes=((2, 8),))
    j.p2p(0, 1, pg=sub)
    j.collective("all_reduce", ranks=[0, 1, 2], state="started")
    return j


def _gz(obj) -> bytes:
    return gzip.compress(json.dumps(obj).encode())


def test_round_trip_is_the_row_form(tmp_path):
    j = _job()
    for r in range(4):
        d = j.dump(r)
        path = tmp_path / f"frnccl_rank_{r}.json.gz"
        path.write_bytes(compact.encode(d))
        got = load_dump(path)
        # JSON has no tuples: the row form as JSON gives it is what must come back
        assert got == json.loads(json.dumps(d))
        assert len(got["entries"]) == len(d["entries"]) > 0


def test_columns_use_every_form():
    d = _job().dump(0)
    cols = json.loads(gzip.decompress(compact.encode(d)))["entries"]["columns"]
    forms = {k: (next(iter(c)) if isinstance(c, dict) else "plain") for k, c in cols.items()}
    assert forms["record_id"] == "delta" and forms["time_created_ns"] == "delta"
    assert forms["time_discovered_completed_ns"] == "offset_from"
    assert forms["profiling_name"] == "table" and forms["frames"] == "table"
    assert "plain" in forms.values()


def test_packed_columns_read_as_the_lists_of_columns_1(tmp_path):
    """A dump as frnccl writes it (packed: hex digits, one-character indexes) and the same columns as JSON lists
    (the columns-1 files of earlier versions) read as the same rows."""
    packed = {"record_id": {"delta": "0000000000000007" "0000000000000001" "ffffffffffffffff"},
              "state": {"table": ["completed", "started"], "index": "010"},
              "time_created_ns": {"delta": "00000000000003e8" "00000000000001f4" "00000000000000c8"},
              "time_discovered_started_ns": {"offset_from": "time_created_ns",
                                             "values": "000000000000000a" "8000000000000000" "fffffffffffffffe"}}
    lists = {"record_id": {"delta": [7, 1, -1]},
             "state": {"table": ["completed", "started"], "index": [0, 1, 0]},
             "time_created_ns": {"delta": [1000, 500, 200]},
             "time_discovered_started_ns": {"offset_from": "time_created_ns", "values": [10, None, -2]}}
    got = {}
    for name, cols, enc in (("packed", packed, compact.ENCODING), ("lists", lists, "columns-1")):
        path = tmp_path / f"{name}.json.gz"
        path.write_bytes(_gz({"format": "frnccl", "version": "3.0", "encoding": enc, "pg_config": {},
                              "entries": {"count": 3, "columns": cols}}))
        got[name] = load_dump(path)["entries"]
    narrow = {"record_id": {"delta": "00" "01" "ff", "start": 7},  # 2 digits a value, the first value a start
              "state": packed["state"],
              "time_created_ns": {"delta": "0000" "01f4" "00c8", "start": 1000},
              "time_discovered_started_ns": {"offset_from": "time_created_ns", "values": "0a" "80" "fe"}}
    path = tmp_path / "narrow.json.gz"
    path.write_bytes(_gz({"format": "frnccl", "version": "3.0", "encoding": compact.ENCODING, "pg_config": {},
                          "entries": {"count": 3, "columns": narrow}}))
    assert load_dump(path)["entries"] == got["packed"]
    assert got["packed"] == got["lists"] == [
        {"record_id": 7, "state": "completed", "time_created_ns": 1000, "time_discovered_started_ns": 1010},
        {"record_id": 8, "state": "started", "time_created_ns": 1500, "time_discovered_started_ns": 0},
        {"record_id": 7, "state": "completed", "time_created_ns": 1700, "time_discovered_started_ns": 1698}]


def test_encoder_packs_what_fits_and_keeps_lists_otherwise():
    """Integers past 64 bits, an offset equal to the null value and a table of more than 64 values stay lists."""
    rows = [{"record_id": 2**70 if i == 1 else i, "time_created_ns": 2**62 if i == 2 else 1000 + i,
             "time_gpu_started_ns": 1000 + i - 2**63 if i == 2 else 0, "profiling_name": f"op{i}"}
            for i in range(70)]
    cols = json.loads(gzip.decompress(compact.encode({"entries": rows})))["entries"]["columns"]
    assert isinstance(cols["record_id"]["delta"], list)
    assert len(cols["time_created_ns"]["delta"]) == 16 * 70  # 2**62 - 1069 apart
    assert cols["time_created_ns"]["start"] == 1000
    assert isinstance(cols["time_gpu_started_ns"]["values"], list) and cols["time_gpu_started_ns"]["values"][0] is None
    assert isinstance(cols["profiling_name"]["index"], list) and len(cols["profiling_name"]["table"]) == 70
    assert compact.decode(compact.encode({"entries": rows}))["entries"] == rows


def test_analyzer_reads_compact_like_pickle(tmp_path):
    j = _job()
    a = analyse(j, tmp_path / "c", fmt="compact")
    b = analyse(j, tmp_path / "p", fmt="pickle")
    assert kinds(a) == kinds(b) and "not_joined" in kinds(a)
    assert a.findings[0].culprit_ranks == b.findings[0].culprit_ranks == [3]


def _hostile(cols: dict, count: int = 2) -> bytes:
    return _gz({"format": "frnccl", "encoding": compact.ENCODING, "pg_config": {},
                "entries": {"count": count, "columns": cols}})


@pytest.mark.parametrize("cols,count,why", [
    ({"op_id": {"table": ["a"], "index": [0, 1]}}, 2, "position in its table"),
    ({"op_id": {"table": ["a", "b"], "index": [0, -1]}}, 2, "position in its table"),
    ({"op_id": {"table": ["a"], "index": [0, "0"]}}, 2, "position in its table"),
    ({"op_id": {"table": ["a"], "index": [0, 0.0]}}, 2, "position in its table"),
    ({"op_id": [1, 2, 3]}, 2, "3 values for 2 entries"),
    ({"op_id": {"delta": [1, "x"]}}, 2, "not integers"),
    ({"op_id": {"what": []}}, 2, "no known form"),
    ({"t": {"offset_from": "nope", "values": [1, 2]}}, 2, "missing column"),
    ({"t": {"offset_from": "b", "values": [1, 2]}, "b": ["x", "y"]}, 2, "not integers"),
    ({}, -1, "integer count"),
    ({"op_id": {"delta": "0" * 31}}, 2, "31 hex digits for 2 entries"),
    ({"op_id": {"delta": "0" * 6}}, 2, "not 2, 4, 8 or 16 each"),
    ({"op_id": {"delta": "0" * 64}}, 2, "not 2, 4, 8 or 16 each"),
    ({"op_id": {"delta": "00", "start": "1"}}, 1, "start is not an integer"),
    ({"op_id": {"delta": [0], "start": 1.5}}, 1, "start is not an integer"),
    ({"op_id": {"delta": "0" * 15 + "x" + "0" * 16}}, 2, "hexadecimal digits only"),
    ({"op_id": {"delta": "0" * 15 + " " + "0" * 16}}, 2, "hexadecimal digits only"),
    ({"op_id": {"delta": 7}}, 2, "not a list or hex digits"),
    ({"t": {"offset_from": "b", "values": "0" * 48}, "b": {"delta": "0" * 32}}, 2, "48 hex digits"),
    ({"op_id": {"table": ["a"], "index": "01"}}, 2, "position in its table"),
    ({"op_id": {"table": ["a"], "index": "0"}}, 2, "1 index characters for 2 entries"),
    ({"op_id": {"table": ["a"] * 300, "index": "0!"}}, 2, "position in its table"),
    ({"op_id": {"table": ["a", "b"], "index": "0\u00e9"}}, 2, "not in the code alphabet"),
    ({"op_id": {"table": "ab", "index": "01"}}, 2, "table must be a list"),
])
def test_malformed_columns_are_refused_in_one_line(tmp_path, cols, count, why):
    path = tmp_path / "frnccl_rank_0.json.gz"
    path.write_bytes(_hostile(cols, count))
    with pytest.raises(DumpError, match=why) as exc:
        load_dump(path)
    assert "\n" not in str(exc.value)


def test_gzip_bomb_is_refused_before_it_inflates(tmp_path, monkeypatch):
    monkeypatch.setattr(compact, "MAX_INFLATED_BYTES", 1 << 20)
    path = tmp_path / "frnccl_rank_0.json.gz"
    path.write_bytes(gzip.compress(b"{" + b" " * (8 << 20) + b"}"))
    assert path.stat().st_size < 64 << 10
    with pytest.raises(DumpError, match="inflates to more than"):
        load_dump(path)


def test_truncated_gzip_is_refused(tmp_path):
    data = compact.encode(_job().dump(0))
    path = tmp_path / "frnccl_rank_0.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DumpError, match="truncated"):
        load_dump(path)


def test_shared_table_value_cannot_unfold_without_bound(tmp_path, monkeypatch):
    """One large table value referenced by every entry: the rows would be count x its size."""
    monkeypatch.setattr(compact, "UNFOLD_FLOOR", 1 << 20)
    n = 20_000
    big = "x" * 4096
    path = tmp_path / "frnccl_rank_0.json.gz"
    path.write_bytes(_hostile({"thread_name": {"table": [big], "index": [0] * n}}, n))
    with pytest.raises(DumpError, match="unfold to about"):
        load_dump(path)


@pytest.mark.parametrize("cols", [
    # itertools.accumulate adds whatever it is given: strings and lists concatenate, so N deltas of L bytes
    # would be N*N*L/2 bytes (a 42 KB file: 186 GiB).
    {"record_id": {"delta": ["ab", "cd"]}},
    {"record_id": {"delta": [[1], [2]]}},
    {"record_id": {"delta": [1.5, 2]}},
    {"record_id": {"delta": [True, 1]}},
    {"t": {"offset_from": "b", "values": ["x", "y"]}, "b": ["ab", "cd"]},
    {"t": {"offset_from": "b", "values": [[1], [2]]}, "b": [[3], [4]]},
])
def test_delta_and_offset_columns_hold_only_integers(tmp_path, cols):
    path = tmp_path / "frnccl_rank_0.json.gz"
    path.write_bytes(_hostile(cols))
    with pytest.raises(DumpError, match="not integers") as exc:
        load_dump(path)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("count", [10**30, 10**12, 1_000_000])
def test_a_count_no_column_holds_is_refused(tmp_path, count):
    """Without columns, nothing in the file pays for the rows: a 100-byte file would be count empty dicts."""
    path = tmp_path / "frnccl_rank_0.json.gz"
    path.write_bytes(_hostile({}, count))
    with pytest.raises(DumpError, match="no columns") as exc:
        load_dump(path)
    assert "\n" not in str(exc.value)


def test_entries_without_keys_still_round_trip_when_there_are_none():
    assert compact.decode(compact.encode({"format": "frnccl", "entries": []}))["entries"] == []


# Reads a file as the library (load_dump), the analyzer's reader (columnar, then summarize) or the command line
# does, in a process of its own with no address-space guard: prints its peak RSS growth (KiB) and what came out.
_READ_AND_MEASURE = """
import resource, subprocess, sys
how, path = sys.argv[1], sys.argv[2]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if how == "cli":
    p = subprocess.run([sys.executable, "-m", "fr_backend.cli", "analyze", path], capture_output=True, text=True)
    out = f"rc {p.returncode}: {p.stdout}{p.stderr}"
    grown = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
else:
    from fr_backend.analyzer import columnar, load
    try:
        if how == "load_dump":
            load.load_dump(path)
        else:
            load.summarize(columnar.read_dump(path), path, 0)
        out = "read"
    except load.DumpError as exc:
        out = f"DumpError: {exc}"
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(grown)
print(out)
"""


@pytest.mark.parametrize("how", ["load_dump", "columnar", "cli"])
def test_a_huge_delta_start_is_counted_before_it_is_decoded(tmp_path, how):
    """A delta list that starts with a 4,300-digit integer (the most int() parses) and goes on with zeros: each
    of the N decoded values is a new 4,300-digit integer. 1.3 KB of file took 1.2 GB before it was refused (or
    read): what delta (and offset) columns decode to was not counted by the unfold bound."""
    import os
    import subprocess
    import sys

    n = 600_000
    text = ('{"format":"frnccl","version":"2.10","encoding":"columns-2","pg_config":{},"entries":{"count":%d,'
            '"columns":{"time_created_ns":{"delta":[%s%s]},"time_discovered_completed_ns":{"offset_from":'
            '"time_created_ns","values":"%s"}}}}' % (n, "9" * 4300, ",0" * (n - 1), "00" * n))
    path = tmp_path / "frnccl_rank_0.json.gz"
    path.write_bytes(gzip.compress(text.encode(), 9))
    assert path.stat().st_size < 16 << 10
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(compact.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", _READ_AND_MEASURE, how, str(path)], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    grown_kib, out = proc.stdout.split("\n", 1)
    assert "unfold to about" in out and out.count("\n") <= (4 if how == "cli" else 1), out
    # What reading one file may take, whatever it says: the bound's floor (256 MiB) for a file this small.
    assert int(grown_kib) < compact.UNFOLD_FLOOR // 1024, (grown_kib, out)


def test_gzip_bomb_under_the_inflate_cap_is_refused_by_memory(tmp_path, monkeypatch):
    """Inflating within MAX_INFLATED_BYTES, the parse of ~24 bytes a byte of text would still take GBs from a
    small file: the command line's address-space bound refuses it in one line."""
    import resource

    from fr_backend.analyzer import columnar, dumpfile

    monkeypatch.setattr(dumpfile, "COMPACT_FLOOR", 64 << 20)
    monkeypatch.setattr(dumpfile, "COMPACT_PER_BYTE", 256)
    n = 8_000_000  # "[]," x n: 24 MB of text, ~500 MB parsed
    path = tmp_path / "frnccl_rank_0.json.gz"
    path.write_bytes(gzip.compress(b'{"entries":[' + b"[]," * n + b'[]],"pg_config":{}}', 9))
    assert path.stat().st_size < 100 << 10
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(DumpError, match="more memory than a compact dump"):
        load_dump(path)
    with pytest.raises(DumpError, match="more memory than a compact dump"):
        columnar.read_dump(path)  # the analyzer's own reading of compact dumps
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 200, grown_mib


def test_a_compact_dump_is_utf8_only(tmp_path):
    """The JSON inside is UTF-8, as written: bytes that json.loads would take as UTF-16 are refused in one line."""
    from fr_backend.analyzer import columnar

    text = json.dumps({"format": "frnccl", "pg_config": {}, "entries": []})
    path = tmp_path / "frnccl_rank_0.json.gz"
    path.write_bytes(gzip.compress(text.encode("utf-16-le")))
    with pytest.raises(DumpError, match="corrupt or truncated JSON in gzip"):
        load_dump(path)
    with pytest.raises(DumpError, match="corrupt or truncated JSON in gzip"):
        columnar.read_dump(path)
