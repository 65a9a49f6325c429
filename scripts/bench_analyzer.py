#!/usr/bin/env python3
"""Benchmark `frnccl analyze` against torch's fr_trace on the same synthetic dumps.

Generates RANKS x ENTRIES torch-compatible pickles (protocol 2, version 2.10 keys plus
frnccl's header; the last collective is never joined by one rank), then times:
  ours : python -m fr_backend.analyzer DIR --json        (--repeats times; median reported)
  torch: python -m torch.distributed.flight_recorder.fr_trace DIR   (once, with --timeout)
Each run is a fresh child. Memory: the peak of the summed PSS of the whole process tree
(the analyzer and its loader workers), sampled every 0.1 s from /proc, and the largest single
process's peak RSS from resource.getrusage(RUSAGE_CHILDREN). Exit status 1 when our verdict
does not name the rank that never joined.

usage: PYTHONPATH=python python scripts/bench_analyzer.py [--ranks 1024] [--entries 2000] [--timeout 300]
                                                          [--repeats 3] [--skip-torch]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

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


def make_shim(where: str) -> str:
    """A package holding only schema + analyzer (symlinks to this tree), so the timing is the analyzer's
    own and not the cost of `import fr_backend` (which imports torch and registers the backend).
    It has an (empty) __init__.py: a namespace package would lose to an installed fr_backend."""
    pkg = os.path.join(where, "fr_backend")
    os.makedirs(pkg, exist_ok=True)
    with open(os.path.join(pkg, "__init__.py"), "w"):
        pass
    src = os.path.join(os.path.abspath(PY), "fr_backend")
    for name in ("schema.py", "dump_keys.def", "analyzer"):
        os.symlink(os.path.join(src, name), os.path.join(pkg, name))
    return where


def generate(root: str, ranks: int, entries: int) -> str:
    from fr_backend.analyzer.synth import Job

    culprit = ranks // 2 + 1
    # one rank's history is built once as a template, then re-stamped per rank (fast, same shape)
    j = Job(2)
    tp = j.new_pg("1", [0, 1], "tp")
    for i in range(entries - 1):
        if i % 4 == 3:
            j.collective("_all_gather_base", tp, sizes=[[1024]], out_sizes=[[2048]])
        else:
            j.collective("all_reduce", sizes=[[1024, 1024]], dtype="BFloat16")
    j.collective("all_reduce", sizes=[[1024, 1024]], dtype="BFloat16", state="started")
    tmpl = j.dump(0)
    os.makedirs(root, exist_ok=True)
    tp_n = 2
    for r in range(ranks):
        d = copy.deepcopy(tmpl) if r == 0 else d  # noqa: F821 (reuse the same dicts, re-stamped)
        grp = r // tp_n
        d["rank"], d["world_size"], d["pid"], d["hostname"] = r, ranks, 1000 + r, f"host{r // 8}"
        d["pg_config"]["0"]["ranks"] = str(list(range(ranks)))
        d["pg_config"]["0"]["global_ranks"] = list(range(ranks))
        d["pg_config"]["0"]["size"] = ranks
        tp_ranks = [grp * tp_n + k for k in range(tp_n)]
        d["pg_config"]["1"]["name"] = f"tp{grp}"
        d["pg_config"]["1"]["ranks"] = str(tp_ranks)
        d["pg_config"]["1"]["global_ranks"] = tp_ranks
        d["pg_status"]["1"]["process_group"] = f"tp{grp}"
        cfg = {"0": d["pg_config"]["0"], f"tp{grp}": d["pg_config"]["1"]}
        out = dict(d)
        out["pg_config"] = cfg
        ents = out["entries"] = []
        for e in d["entries"]:
            e2 = dict(e)
            if e["process_group"][0] != "0":
                e2["process_group"] = (f"tp{grp}", "tp")
            ents.append(e2)
        if r == culprit:
            ents.pop()
            out["pg_status"] = copy.deepcopy(d["pg_status"])
            out["pg_status"]["0"]["last_enqueued_collective"] -= 1
            out["thread_stacks"] = 'Thread 0x1 (most recent call first):\n  File "train.py", line 9 in load\n'
        with open(os.path.join(root, f"frnccl_rank_{r}"), "wb") as f:
            pickle.dump(out, f, protocol=2)
    return root


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
    ap.add_argument("--full-package", action="store_true",
                    help="run through `import fr_backend` (adds its torch import) instead of the analyzer-only shim")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="frnccl_bench_")
    root = a.dumps or os.path.join(work, "dumps")
    pypath = os.path.abspath(PY) if a.full_package else make_shim(os.path.join(work, "shim"))
    sys.path.insert(0, pypath)
    expected = a.ranks // 2 + 1
    ok = True
    try:
        t = time.perf_counter()
        if not a.dumps:
            generate(root, a.ranks, a.entries)
        gen_s = time.perf_counter() - t
        size = sum(os.path.getsize(os.path.join(root, f)) for f in os.listdir(root))
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
        if not a.skip_torch:
            # torch's own environment: not the shim (torch's backend autoload would look for frnccl's
            # entry point in it), and no backend autoload at all: it is not part of fr_trace's work
            tenv = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
            th = timed([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", root], a.timeout, tenv)
        print(f"input: {a.ranks} ranks x {a.entries} entries, {size / 2**20:.0f} MiB of pickles "
              f"(generated in {gen_s:.0f} s); expected culprit: rank {expected}; cores: {os.cpu_count()}")
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
