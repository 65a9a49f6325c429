#!/usr/bin/env python3
"""Benchmark `frnccl analyze` against torch's fr_trace on the same synthetic dumps.

Generates RANKS x ENTRIES dumps (frnccl 3.0 keys; the last collective is never joined by one rank),
in the compact encoding (--format compact, the default) or as torch-compatible pickles (--format
pickle, protocol 2), then times:
  ours : python -m fr_backend.analyzer DIR --json        (median of --repeats runs)
  ours before: the same with the analyzer of --before DIR (another checkout's python/), if given
  torch: python -m torch.distributed.flight_recorder.fr_trace DIR   (pickle and torch formats only: torch
         reads no compact dumps)
Each round runs every tool once, in turns, the order reversed every other round (A/B interleaved), and
--repeats rounds are run; the medians and their ratios to fr_trace (and to --before) are printed. --format
torch writes torch 2.13's own dumps (nccl_trace_rank_R, version 2.10, no frnccl keys).
Each run is a fresh child. Memory: the peak of the summed PSS of the whole process tree
(the analyzer and its loader workers), sampled every 0.1 s from /proc, and the largest single
process's peak RSS from resource.getrusage(RUSAGE_CHILDREN). Exit status 1 when our verdict
does not name the rank that never joined.

usage: PYTHONPATH=python python scripts/bench_analyzer.py [--ranks 1024] [--entries 2000] [--timeout 300]
                                                          [--repeats 3] [--skip-torch] [--format compact|pickle|torch]
                                                          [--reuse DIR | --keep | --dumps DIR] [--before DIR]
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


def _template(entries: int, world_only: bool = False) -> dict:
    """One rank's history, built once; every rank's dump is this, re-stamped (fast, same shape)."""
    from fr_backend.analyzer.synth import Job

    j = Job(2)
    tp = j.default if world_only else j.new_pg("1", [0, 1], "tp")
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
    d["pg_config"] = {"0": d0}
    d["pg_status"] = copy.deepcopy(tmpl["pg_status"])
    if "1" in tmpl["pg_config"]:
        d["pg_config"][f"tp{grp}"] = dict(tmpl["pg_config"]["1"], name=f"tp{grp}",
                                          members=f"{grp * TP_N}:{grp * TP_N + TP_N}", size=TP_N)
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



_TORCH_DROPPED = ("peer", "time_gpu_started_ns", "time_gpu_completed_ns")  # keys torch 2.13's writer has not


def _torch_dump(d: dict) -> dict:
    """A rank's dump as torch 2.13's own recorder writes it (version 2.10 keys, no frnccl header): pg_config
    by group name with members as text, pg_status keyed by the process-local group id, entries without the
    keys only frnccl writes."""
    from fr_backend import members

    local = {"0": "0"}
    cfg = {}
    for k, c in d["pg_config"].items():
        ranks = members.decode(c["members"], c["size"])
        cfg[c["name"]] = {"name": c["name"], "desc": c["desc"], "ranks": str(ranks)}
        local.setdefault(c["name"], str(len(local)))
    status = {}
    for st in d["pg_status"].values():
        status[local[st["process_group"]]] = {k: st[k] for k in ("last_enqueued_collective",
                                                                "last_started_collective",
                                                                "last_completed_collective")}
    ents = [{k: v for k, v in e.items() if k not in _TORCH_DROPPED} for e in d["entries"]]
    return {"version": "2.10", "pg_config": cfg, "pg_status": status, "comm_lib_version": "2.21.5",
            "entries": ents}


def generate(root: str, ranks: int, entries: int, fmt: str = "compact", world_only: bool = False) -> str:
    """RANKS dumps in ``fmt``: "pickle" (torch-compatible protocol-2 pickles, flat folder) or "compact"
    (columns-2 gzip'ed JSON). Compact files are spliced from text compressed once: only the header and the
    tp group's name differ from rank to rank, so a rank costs its header's JSON, a CRC and a write (100,000
    files: see docs/benchmarks.md), not the ~25 ms of building rows and encoding them."""
    from fr_backend import compact

    culprit = ranks // 2 + 1
    tmpl = _template(entries, world_only)
    os.makedirs(root, exist_ok=True)
    if fmt == "pickle":
        for r in range(ranks):
            with open(os.path.join(root, f"frnccl_rank_{r}"), "wb") as f:
                pickle.dump(_rank_dump(tmpl, r, ranks, culprit), f, protocol=2)
        return root
    if fmt == "torch":  # torch's own file names and format
        for r in range(ranks):
            with open(os.path.join(root, f"nccl_trace_rank_{r}"), "wb") as f:
                pickle.dump(_torch_dump(_rank_dump(tmpl, r, ranks, culprit)), f, protocol=2)
        return root
    if world_only:  # the splice below fills in the tp group's name
        raise SystemExit("bench_analyzer: --world-only applies to --format pickle and torch")
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
    ap.add_argument("--format", choices=("compact", "pickle", "torch"), default="compact",
                    help="dump format generated (compact: columns-2 gzip'ed JSON, as frnccl writes by default; "
                         "pickle: frnccl's keys in torch-compatible pickles; torch: torch 2.13's own dumps)")
    ap.add_argument("--reuse", metavar="DIR",
                    help="generate the dumps into DIR once and reuse them on later runs with the same ranks, "
                         "entries and format (DIR/.bench_stamp says which)")
    ap.add_argument("--python", default=PY, metavar="DIR",
                    help="time the analyzer of this python/ folder (e.g. another checkout's, for before/after)")
    ap.add_argument("--world-only", action="store_true",
                    help="every op in the default group (no 2-rank tp groups): torch's fr_trace scans other "
                         "groups' unmatched entries once per collective, so with the tp groups it does not "
                         "finish at 1,024 ranks")
    ap.add_argument("--before", metavar="DIR",
                    help="also time the analyzer of this python/ folder, in turns with this tree's (A/B)")
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
        stamp = f"{a.ranks} {a.entries} {a.format}{' world' if a.world_only else ''} {STAMP_VERSION}\n"
        gen = "reused"
        if a.reuse and _read(os.path.join(a.reuse, ".bench_stamp")) == stamp:
            pass
        elif not a.dumps:
            if a.reuse:
                shutil.rmtree(a.reuse, ignore_errors=True)
            generate(root, a.ranks, a.entries, a.format, a.world_only)
            if a.reuse:
                with open(os.path.join(a.reuse, ".bench_stamp"), "w") as f:
                    f.write(stamp)
            gen = f"generated in {time.perf_counter() - t:.0f} s"
        size = sum(e.stat().st_size for e in os.scandir(root) if not e.name.startswith("."))
        env = dict(os.environ, PYTHONPATH=pypath)
        load0 = os.getloadavg()[0]
        # the tools take turns, round by round, the order reversed every other round: the machine's load
        # then weighs on each alike (A/B interleaved in one run)
        tools: list[tuple[str, list[str], dict[str, str], bool]] = [
            ("frnccl analyze", [sys.executable, "-m", "fr_backend.analyzer", root, "--json"], env, True)]
        if a.before:
            benv = dict(os.environ, PYTHONPATH=make_shim(os.path.join(work, "before"), a.before))
            tools.append(("frnccl [before]", [sys.executable, "-m", "fr_backend.analyzer", root, "--json"], benv,
                          True))
        if not a.skip_torch and a.format in ("pickle", "torch"):
            # torch's own environment: not the shim (torch's backend autoload would look for frnccl's
            # entry point in it), and no backend autoload at all: it is not part of fr_trace's work
            tenv = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
            tools.append(("torch fr_trace", [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                                             root], tenv, False))
        runs: dict[str, list[tuple[dict, str]]] = {name: [] for name, *_ in tools}
        for i in range(max(1, a.repeats)):
            for name, cmd, tenv, ours in (tools if i % 2 == 0 else tools[::-1]):
                r = timed(cmd, a.timeout, tenv)
                if ours:
                    try:
                        f0 = json.loads(r["out"])["findings"][0]
                        good = f0["kind"] == "not_joined" and f0["culprit_ranks"] == [expected]
                        v = f"{f0['kind']} culprit={f0['culprit_ranks']} ({'correct' if good else 'WRONG'})"
                    except (ValueError, IndexError, KeyError):
                        good, v = False, "unparsed (WRONG)"
                    ok = ok and good
                else:
                    v = "timeout" if r["rc"] == "timeout" else ("error" if r["rc"] else "ran")
                runs[name].append((r, v))
        print(f"input: {a.ranks} ranks x {a.entries} entries, {size / 2**20:.0f} MiB of {a.format} dumps "
              f"({gen}); expected culprit: rank {expected}; cores: {os.cpu_count()}")
        print(f"load average before: {load0:.1f}, after: {os.getloadavg()[0]:.1f} (other work on the machine "
              "inflates wall time)")
        print(f"{'tool':<16} {'exit':>7} {'wall s':>8} {'CPU s':>7} {'tree PSS MiB':>13} {'max RSS MiB':>12}  verdict")
        cpu_med: dict[str, float] = {}
        wall_med: dict[str, float] = {}
        for name, rv in runs.items():
            for r, v in rv:
                print(f"{name:<16} {r['rc']!s:>7} {r['s']:>8.1f} {r['cpu']:>7.1f} {_mib(r['pss_kb']):>13} "
                      f"{_mib(r['rss_kb']):>12}  {v}")
            walls = sorted(r["s"] for r, _ in rv)
            wall_med[name] = statistics.median(walls)
            cpu_med[name] = statistics.median(r["cpu"] for r, _ in rv)
            print(f"{'  median':<16} {'':>7} {wall_med[name]:>8.1f} {cpu_med[name]:>7.1f} "
                  f"{_mib(max(r['pss_kb'] for r, _ in rv)):>13} {_mib(max(r['rss_kb'] for r, _ in rv)):>12}  "
                  f"[{walls[0]:.1f}-{walls[-1]:.1f}] over {len(rv)} runs")
        for name in runs:
            for base in runs:
                if base != name and base != "frnccl analyze" and cpu_med[base] > 0:
                    print(f"ratio {name} / {base}: CPU {cpu_med[name] / cpu_med[base]:.2f}, "
                          f"wall {wall_med[name] / wall_med[base]:.2f} (medians)")
        for name, rv in runs.items():
            for r, _ in rv:
                if r["rc"] not in (0, 1, "timeout") or (name == "torch fr_trace" and r["rc"] == 1):
                    print(f"--- {name} stderr tail:\n{r['err'][-600:]}")
    finally:
        if a.keep:
            print("dumps kept in", root, "; PYTHONPATH", pypath)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
