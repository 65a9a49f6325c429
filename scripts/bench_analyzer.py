#!/usr/bin/env python3
"""Benchmark `frnccl analyze` against torch's fr_trace on the same synthetic dumps.

Generates RANKS x ENTRIES dumps (frnccl 3.0 keys; the last collective is never joined by one rank),
in the compact encoding (--format compact, the default) or as torch-compatible pickles (--format
pickle, protocol 2), then times:
  ours : python -m fr_backend.analyzer DIR --json        (--repeats times; median reported)
  torch: python -m torch.distributed.flight_recorder.fr_trace DIR   (once, with --timeout; pickles only,
         torch reads no compact dumps)
Each run is a fresh child. Memory: the peak of the summed PSS of the whole process tree
(the analyzer and its loader workers), sampled every 0.1 s from /proc, and the largest single
process's peak RSS from resource.getrusage(RUSAGE_CHILDREN). Exit status 1 when our verdict
does not name the rank that never joined.

usage: PYTHONPATH=python python scripts/bench_analyzer.py [--ranks 1024] [--entries 2000] [--timeout 300]
                                                          [--repeats 3] [--skip-torch] [--format compact|pickle]
                                                          [--reuse DIR | --keep | --dumps DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
PY = os.path.join(HERE, "..", "python")

CHILD = r"""
import json, os, resource, subprocess, sys, tempfile, time

def tree(pid):
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out

def pss_rss_kb(pids):
    pss = rss = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1])
                    elif line.startswith("Rss:"):
                        rss += int(line.split()[1])
        except OSError:
            pass
    return pss, rss

limit = float(sys.argv[1])
with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
    t = time.perf_counter()
    p = subprocess.Popen(sys.argv[2:], stdout=fo, stderr=fe)
    peak_pss = peak_rss = 0
    rc = None
    while rc is None:
        if time.perf_counter() - t > limit:
            p.kill()
            p.wait()
            rc = "timeout"
            break
        pss, rss = pss_rss_kb(tree(p.pid))
        peak_pss, peak_rss = max(peak_pss, pss), max(peak_rss, rss)
        try:
            rc = p.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            pass
    dt = time.perf_counter() - t
    fo.seek(0)
    fe.seek(0)
    out, err = fo.read(), fe.read()
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": rc, "s": dt, "rss_kb": ru.ru_maxrss, "pss_kb": peak_pss, "tree_rss_kb": peak_rss,
                  "cpu": ru.ru_utime + ru.ru_stime, "out": out.decode(errors="replace"),
                  "err": err.decode(errors="replace")[-1500:]}))
"""


def make_shim(where: str, py: str = PY) -> str:
    """A package holding only schema + analyzer (symlinks to this tree), so the timing is the analyzer's
    own and not the cost of `import fr_backend` (which imports torch and registers the backend).
    It holds schema, compact, members and analyzer and an (empty) __init__.py: a namespace package would lose to an installed fr_backend."""
    pkg = os.path.join(where, "fr_backend")
    os.makedirs(pkg, exist_ok=True)
    with open(os.path.join(pkg, "__init__.py"), "w"):
        pass
    src = os.path.join(os.path.abspath(py), "fr_backend")
    for name in ("schema.py", "dump_keys.def", "compact.py", "members.py", "analyzer"):
        os.symlink(os.path.join(src, name), os.path.join(pkg, name))
    return where


def _template(entries: int) -> dict:
    """One rank's history, built once; every rank's dump is this, re-stamped (fast, same shape)."""
    from fr_backend.analyzer.synth import Job

    j = Job(2)
    tp = j.new_pg("1", [0, 1], "tp")
    for i in range(entries - 1):
        if i % 4 == 3:
            j.collective("_all_gather_base", tp, sizes=[[1024]], out_sizes=[[2048]])
        else:
            j.collective("all_reduce", sizes=[[1024, 1024]], dtype="BFloat16")
    j.collective("all_reduce", sizes=[[1024, 1024]], dtype="BFloat16", state="started")
    return j.dump(0)


TP_N = 2


def _rank_dump(tmpl: dict, r: int, ranks: int, culprit: int, with_entries: bool = True) -> dict:
    """Rank r's dump: the template's entries (its tp group renamed), header and groups of rank r; the culprit
    never joins the last collective of the default group. Members as the recorder writes them: one run each."""
    d = dict(tmpl)
    grp = r // TP_N
    d["rank"], d["world_size"], d["pid"], d["hostname"] = r, ranks, 1000 + r, f"host{r // 8}"
    d0 = dict(tmpl["pg_config"]["0"], members=f"0:{ranks}", size=ranks)
    d1 = dict(tmpl["pg_config"]["1"], name=f"tp{grp}", members=f"{grp * TP_N}:{grp * TP_N + TP_N}", size=TP_N)
    d["pg_config"] = {"0": d0, f"tp{grp}": d1}
    d["pg_status"] = copy.deepcopy(tmpl["pg_status"])
    d["pg_status"]["1"]["process_group"] = f"tp{grp}"
    if not with_entries:
        d.pop("entries")
        return d
    ents = d["entries"] = []
    for e in tmpl["entries"]:
        e2 = dict(e)
        if e["process_group"][0] != "0":
            e2["process_group"] = (f"tp{grp}", "tp")
        ents.append(e2)
    if r == culprit:
        ents.pop()
        d["pg_status"]["0"]["last_enqueued_collective"] -= 1
        d["thread_stacks"] = 'Thread 0x1 (most recent call first):\n  File "train.py", line 9 in load\n'
    return d


def _deflate(text: bytes, last: bool) -> bytes:
    """Raw deflate of ``text`` from a fresh compressor: it refers to nothing before it, and (not ``last``) ends
    on a byte with a sync flush, so pieces made apart are one valid stream once put side by side."""
    c = zlib.compressobj(1, zlib.DEFLATED, -15)
    return c.compress(text) + c.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)


class _Spliced:
    """A gzip file made of pieces compressed once (the entries' text) and pieces made per rank (its header,
    its tp group's name): a rank costs its header's JSON and a CRC, not compressing 200 KB again."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces  # the constant texts between the per-rank parts
        self.packed = [_deflate(p, last=i == len(pieces) - 1) for i, p in enumerate(pieces)]

    def file(self, parts: list[bytes]) -> bytes:
        """parts[i] goes before pieces[i]."""
        out, crc, size = [b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"], 0, 0
        for part, piece, packed in zip(parts, self.pieces, self.packed):
            out += [_deflate(part, last=False), packed]
            crc = zlib.crc32(piece, zlib.crc32(part, crc))
            size += len(part) + len(piece)
        out.append(struct.pack("<II", crc, size & 0xFFFFFFFF))
        return b"".join(out)


def generate(root: str, ranks: int, entries: int, fmt: str = "compact") -> str:
    """RANKS dumps in ``fmt``: "pickle" (torch-compatible protocol-2 pickles, flat folder) or "compact"
    (columns-2 gzip'ed JSON). Compact files are spliced from text compressed once: only the header and the
    tp group's name differ from rank to rank, so a rank costs its header's JSON, a CRC and a write (100,000
    files: see docs/benchmarks.md), not the ~25 ms of building rows and encoding them."""
    from fr_backend import compact

    culprit = ranks // 2 + 1
    tmpl = _template(entries)
    os.makedirs(root, exist_ok=True)
    if fmt == "pickle":
        for r in range(ranks):
            with open(os.path.join(root, f"frnccl_rank_{r}"), "wb") as f:
                pickle.dump(_rank_dump(tmpl, r, ranks, culprit), f, protocol=2)
        return root
    # the columns of a non-culprit rank, as text, its tp group's name left as a placeholder
    d0 = _rank_dump(tmpl, 0, ranks, culprit)
    cols = json.loads(compact.encode_json(d0))["entries"]["columns"]
    hole = "\x00TP\x00"
    pgc = cols["process_group"]
    pgc["table"] = [[hole, "tp"] if t[0] != "0" else t for t in pgc["table"]]
    ent_text = json.dumps({"count": len(d0["entries"]), "columns": cols}, separators=(",", ":"))
    a, _, b = ent_text.partition(json.dumps(hole))
    spliced = _Spliced([f',"entries":{a}'.encode(), f"{b}}}".encode()])
    for r in range(ranks):
        if r == culprit:
            data = compact.encode(_rank_dump(tmpl, r, ranks, culprit), level=1)
        else:
            h = _rank_dump(tmpl, r, ranks, culprit, with_entries=False)
            h["encoding"] = compact.ENCODING
            ht = json.dumps(h, separators=(",", ":"), ensure_ascii=False)
            data = spliced.file([ht[:-1].encode(), json.dumps(f"tp{r // TP_N}").encode()])
        with open(os.path.join(root, f"frnccl_rank_{r}.json.gz"), "wb") as f:
            f.write(data)
    return root


STAMP_VERSION = "v4"  # bump when generate() changes what it writes


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def timed(cmd: list[str], timeout: float, env: dict[str, str]) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, str(timeout), *cmd], capture_output=True, text=True, env=env,
                       check=False)
    return json.loads(p.stdout)


def _mib(kb: int) -> str:
    return f"{kb / 1024:.0f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=300, help="limit per run, seconds (torch's fr_trace too)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of ours (the median is reported)")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--dumps", help="use this folder of dumps (from an earlier --keep) instead of generating")
    ap.add_argument("--format", choices=("compact", "pickle"), default="compact",
                    help="dump format generated (compact: columns-2 gzip'ed JSON, as frnccl writes by default)")
    ap.add_argument("--reuse", metavar="DIR",
                    help="generate the dumps into DIR once and reuse them on later runs with the same ranks, "
                         "entries and format (DIR/.bench_stamp says which)")
    ap.add_argument("--python", default=PY, metavar="DIR",
                    help="time the analyzer of this python/ folder (e.g. another checkout's, for before/after)")
    ap.add_argument("--full-package", action="store_true",
                    help="run through `import fr_backend` (adds its torch import) instead of the analyzer-only shim")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="frnccl_bench_")
    root = a.dumps or a.reuse or os.path.join(work, "dumps")
    pypath = os.path.abspath(a.python) if a.full_package else make_shim(os.path.join(work, "shim"), a.python)
    sys.path.insert(0, make_shim(os.path.join(work, "gen")))  # the generator is this tree's
    expected = a.ranks // 2 + 1
    ok = True
    try:
        t = time.perf_counter()
        stamp = f"{a.ranks} {a.entries} {a.format} {STAMP_VERSION}\n"
        gen = "reused"
        if a.reuse and _read(os.path.join(a.reuse, ".bench_stamp")) == stamp:
            pass
        elif not a.dumps:
            if a.reuse:
                shutil.rmtree(a.reuse, ignore_errors=True)
            generate(root, a.ranks, a.entries, a.format)
            if a.reuse:
                with open(os.path.join(a.reuse, ".bench_stamp"), "w") as f:
                    f.write(stamp)
            gen = f"generated in {time.perf_counter() - t:.0f} s"
        size = sum(e.stat().st_size for e in os.scandir(root) if not e.name.startswith("."))
        env = dict(os.environ, PYTHONPATH=pypath)
        load0 = os.getloadavg()[0]
        runs = []
        verdicts = []
        for _ in range(max(1, a.repeats)):
            r = timed([sys.executable, "-m", "fr_backend.analyzer", root, "--json"], a.timeout, env)
            try:
                f0 = json.loads(r["out"])["findings"][0]
                good = f0["kind"] == "not_joined" and f0["culprit_ranks"] == [expected]
                verdicts.append(f"{f0['kind']} culprit={f0['culprit_ranks']} ({'correct' if good else 'WRONG'})")
            except (ValueError, IndexError, KeyError):
                good = False
                verdicts.append("unparsed (WRONG)")
            ok = ok and good
            runs.append(r)
        th = None
        if not a.skip_torch and a.format == "pickle":
            # torch's own environment: not the shim (torch's backend autoload would look for frnccl's
            # entry point in it), and no backend autoload at all: it is not part of fr_trace's work
            tenv = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
            th = timed([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", root], a.timeout, tenv)
        print(f"input: {a.ranks} ranks x {a.entries} entries, {size / 2**20:.0f} MiB of {a.format} dumps "
              f"({gen}); expected culprit: rank {expected}; cores: {os.cpu_count()}")
        print(f"load average before: {load0:.1f}, after: {os.getloadavg()[0]:.1f} (other work on the machine "
              "inflates wall time)")
        print(f"{'tool':<16} {'exit':>7} {'wall s':>8} {'CPU s':>7} {'tree PSS MiB':>13} {'max RSS MiB':>12}  verdict")
        for r, v in zip(runs, verdicts):
            print(f"{'frnccl analyze':<16} {r['rc']!s:>7} {r['s']:>8.1f} {r['cpu']:>7.1f} {_mib(r['pss_kb']):>13} "
                  f"{_mib(r['rss_kb']):>12}  {v}")
        walls = sorted(r["s"] for r in runs)
        med = statistics.median(walls)
        print(f"{'  median':<16} {'':>7} {med:>8.1f} {statistics.median(r['cpu'] for r in runs):>7.1f} "
              f"{_mib(max(r['pss_kb'] for r in runs)):>13} {_mib(max(r['rss_kb'] for r in runs)):>12}  "
              f"[{walls[0]:.1f}-{walls[-1]:.1f}] over {len(runs)} runs")
        if th is not None:
            tv = "timeout" if th["rc"] == "timeout" else ("error" if th["rc"] else "ran")
            print(f"{'torch fr_trace':<16} {th['rc']!s:>7} {th['s']:>8.1f} {th['cpu']:>7.1f} "
                  f"{_mib(th['pss_kb']):>13} {_mib(th['rss_kb']):>12}  {tv}")
        for name, r, fine in [("frnccl analyze", x, (0, 1)) for x in runs] + ([("torch fr_trace", th, (0,))] if th else []):
            if r["rc"] not in (*fine, "timeout"):
                print(f"--- {name} stderr tail:\n{r['err'][-600:]}")
    finally:
        if a.keep:
            print("dumps kept in", root, "; PYTHONPATH", pypath)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
