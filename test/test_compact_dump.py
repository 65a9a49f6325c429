"""The compact dump as the C++ monitor writes it, in real 2-rank CPU jobs (workers/compact_dump.py):
read back by Python's decoder with the same entries as the pickle of the same dump, a gzip file of
the column forms compact.py specifies, written uncompressed where libz cannot be loaded, and read
by `frnccl analyze`, `trace` and `report` when it is the only format (the default)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dist_harness import TEST_DIR, Job, plain, run_ranks
from fr_backend import compact, members
from fr_backend.analyzer.load import load_dump

ROOT = TEST_DIR.parent
JOB_TIMEOUT_S = 90
FAST_DUMPS = {"FRNCCL_COORD_CHECK_MS": "50"}
NO_LIBZ = "libfrnccl-no-such-zlib.so.1"


def run_job(dump_dir: Path, **env: str) -> tuple[Job, Path]:
    env = {"FRNCCL_DUMP_DIR": str(dump_dir), "FRNCCL_STACKS": "python", **FAST_DUMPS, **env}
    job = run_ranks("compact_dump.py", 2, timeout=JOB_TIMEOUT_S, env=env)
    job.assert_ok()
    res = job.results()
    assert res[0]["incident"] and res[0]["incident"] == res[1]["incident"], job.describe()
    return job, Path(res[0]["incident"])


def frnccl(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FRNCCL_")}
    return subprocess.run([sys.executable, "-m", "fr_backend.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=str(ROOT))


@pytest.fixture(scope="module")
def compact_and_pickle(tmp_path_factory):
    job, incident = run_job(tmp_path_factory.mktemp("compact_pickle") / "dumps", FRNCCL_DUMP_FORMATS="compact,pickle")
    return job, incident


@pytest.fixture(scope="module")
def default_formats(tmp_path_factory):
    env = {} if "FRNCCL_DUMP_FORMATS" not in os.environ else {"FRNCCL_DUMP_FORMATS": ""}
    return run_job(tmp_path_factory.mktemp("defaults") / "dumps", **env)


def without_torch_ranks(pickled: dict) -> dict:
    """A pickled dump as the compact one holds it: the pickle is what torch's fr_trace reads as it is, so each
    group also carries torch's `ranks` text, which must be the group's `members`."""
    out = plain(pickled)
    for g in out["pg_config"].values():
        assert g.pop("ranks") == str(members.decode(g["members"], g["size"])), g
    return out


def test_compact_has_the_entries_of_the_pickle(compact_and_pickle):
    job, incident = compact_and_pickle
    for r, res in enumerate(job.results()):
        c = load_dump(incident / "compact" / f"frnccl_rank_{r}.json.gz")
        p = load_dump(incident / "pickle" / f"frnccl_rank_{r}")
        assert len(c["entries"]) == len(p["entries"]) == res["entries"], job.describe()
        assert plain(c) == without_torch_ranks(p)
        assert all(e["frames"] for e in c["entries"])  # python stacks, symbolized
    states = {e["state"] for e in load_dump(incident / "compact" / "frnccl_rank_1.json.gz")["entries"]}
    assert states == {"completed", "started"} or states == {"completed", "scheduled"}, states


def test_compact_file_is_gzip_of_the_specified_columns(compact_and_pickle):
    job, incident = compact_and_pickle
    path = incident / "compact" / "frnccl_rank_0.json.gz"
    raw = path.read_bytes()
    # RFC 1952: magic, deflate, no flags, mtime 0, XFL 4 (fastest), OS 3 (Unix)
    assert raw[:10] == b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\x03", raw[:10]
    text = gzip.decompress(raw)  # checks the CRC-32 and size trailer too
    obj = json.loads(text)
    assert obj["encoding"] == "columns-2" and obj["rank"] == 0 and obj["format"] == "frnccl"
    n = obj["entries"]["count"]
    cols = obj["entries"]["columns"]
    assert n == job.results()[0]["entries"]
    for key in ("record_id", "collective_seq_id", "p2p_seq_id", "op_id", "time_created_ns"):
        # packed, as few hex digits per value as the column needs; the first value is the start
        assert set(cols[key]) == {"delta", "start"} and type(cols[key]["start"]) is int, key
        assert len(cols[key]["delta"]) // n in (2, 4, 8) and len(cols[key]["delta"]) % n == 0, key
    for key in ("time_discovered_started_ns", "time_discovered_completed_ns", "time_gpu_started_ns",
                "time_gpu_completed_ns"):
        assert cols[key]["offset_from"] == "time_created_ns" and len(cols[key]["values"]) % n == 0, key
    assert cols["time_gpu_started_ns"]["values"] == "80" * n  # CPU: never timed (null, at the narrowest width)
    assert cols["record_id"]["delta"] == "00" + "01" * (n - 1)
    for key in ("profiling_name", "process_group", "input_sizes", "input_dtypes", "frames", "state"):
        assert set(cols[key]) == {"table", "index"} and len(cols[key]["index"]) == n, key
        assert len(cols[key]["table"]) < n / 4, (key, cols[key]["table"])  # repeats stored once
        assert set(cols[key]["index"]) <= set(compact.CODE_ALPHABET[:len(cols[key]["table"])]), key
    for key in ("is_p2p", "retired"):
        assert isinstance(cols[key], list) and len(cols[key]) == n, key
    assert len(raw) < 40 * n + 4096, len(raw)


def test_without_libz_the_same_columns_are_written_uncompressed(tmp_path):
    job, incident = run_job(tmp_path / "dumps", FRNCCL_DUMP_FORMATS="compact,pickle", FRNCCL_TEST_LIBZ=NO_LIBZ)
    assert sorted(p.name for p in (incident / "compact").iterdir()) == ["frnccl_rank_0.json", "frnccl_rank_1.json"]
    for r in range(2):
        text = (incident / "compact" / f"frnccl_rank_{r}.json").read_text()
        assert json.loads(text)["encoding"] == "columns-2"
        assert plain(load_dump(incident / "compact" / f"frnccl_rank_{r}.json")) == \
            without_torch_ranks(load_dump(incident / "pickle" / f"frnccl_rank_{r}"))
        said = [ln for ln in job.ranks[r].output.splitlines() if "compact dumps are written uncompressed" in ln]
        assert len(said) == 1 and NO_LIBZ in said[0], job.ranks[r].output[-2000:]
    proc = frnccl("analyze", str(incident))
    assert proc.returncode in (0, 1) and "dumps from 2 ranks" in proc.stdout, proc.stdout + proc.stderr


def test_default_writes_only_the_compact_folder(default_formats):
    job, incident = default_formats
    assert sorted(p.name for p in incident.iterdir()) == ["compact"], job.describe()
    assert sorted(p.name for p in (incident / "compact").iterdir()) == ["frnccl_rank_0.json.gz",
                                                                          "frnccl_rank_1.json.gz"]


def test_analyze_trace_and_report_read_a_compact_incident(default_formats, tmp_path):
    job, incident = default_formats
    proc = frnccl("analyze", "--json", str(incident))
    # rank 1 waits in a recv that rank 0 posts only after the dump, which was asked for (fr_backend.dump()) well
    # within the group's timeout: read from compact dumps alone, the recv is reported, as information, not a fault
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["world_size"] == 2 and sorted(report["ranks_found"]) == [0, 1], proc.stdout[:2000]
    # a straggler finding (performance) may come first: on a loaded machine one rank of this tight loop can be
    # late by a few ms by the clocks; it is timing, not what this test reads
    timed = [f for f in report["findings"] if f["severity"] == "performance"]
    assert all(f["kind"] == "straggler" for f in timed), proc.stdout[:2000]
    first = [f for f in report["findings"] if f["severity"] != "performance"][0]
    assert (first["kind"], first["severity"], first["culprit_ranks"]) == ("p2p_unmatched", "info", []), \
        proc.stdout[:2000]
    assert "rank 0 never posted the partner" in first["detail"] and "rank 1 waits in it" in first["detail"], \
        proc.stdout[:2000]

    trace_out = tmp_path / "merged.json"
    proc = frnccl("trace", str(incident), "-o", str(trace_out))
    assert proc.returncode == 0 and "from 2 ranks" in proc.stdout, proc.stdout + proc.stderr
    events = json.loads(trace_out.read_text())["traceEvents"]
    ops = [e for e in events if e.get("cat") in ("collective", "p2p")]
    # every entry of both ranks is an event; no rank is marked a culprit, as the analysis names none
    assert len(ops) == sum(r["entries"] for r in job.results()), len(ops)
    assert {e["pid"] for e in ops} == {0, 1} and {"all_reduce", "_all_gather_base", "broadcast"} <= {e["name"] for e in ops}
    assert not any("CULPRIT" in str(e.get("name", "")) for e in events)

    html_out = tmp_path / "report.html"
    proc = frnccl("report", str(incident), "-o", str(html_out))
    assert proc.returncode == 0 and f"wrote {html_out}" in proc.stdout, proc.stdout + proc.stderr
    html = html_out.read_text()
    assert "<html" in html.lower() and "all_reduce" in html


FAILING_LIBZ_C = """
/* A libz whose compress2 fails as zlib's does when it cannot allocate its state (Z_MEM_ERROR). */
int compress2(unsigned char* d, unsigned long* dl, const unsigned char* s, unsigned long sl, int level) { return -4; }
unsigned long compressBound(unsigned long n) { return n + (n >> 12) + (n >> 14) + (n >> 25) + 13; }
unsigned long crc32(unsigned long c, const unsigned char* b, unsigned int n) { return 0; }
"""


def test_when_compressing_fails_the_columns_are_written_uncompressed(tmp_path):
    """compact is the only default format: a compress2 failure (out of memory) must not leave the rank without a dump."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a failing libz")
    src = tmp_path / "failing_z.c"
    src.write_text(FAILING_LIBZ_C)
    lib = tmp_path / "libfailing_z.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=120)
    job, incident = run_job(tmp_path / "dumps", FRNCCL_DUMP_FORMATS="compact,pickle", FRNCCL_TEST_LIBZ=str(lib))
    assert sorted(p.name for p in (incident / "compact").iterdir()) == ["frnccl_rank_0.json", "frnccl_rank_1.json"]
    for r in range(2):
        assert plain(load_dump(incident / "compact" / f"frnccl_rank_{r}.json")) == \
            without_torch_ranks(load_dump(incident / "pickle" / f"frnccl_rank_{r}"))
        said = [ln for ln in job.ranks[r].output.splitlines() if "compact dumps are written uncompressed" in ln]
        assert len(said) == 1 and "compress2 failed" in said[0], job.ranks[r].output[-2000:]
