#!/usr/bin/env python3
"""Benchmark `frnccl analyze` against torch's fr_trace on the same synthetic dumps.

Generates RANKS x ENTRIES torch-compatible pickles (protocol 2, version 2.10 keys plus
frnccl's header; the last collective is never joined by one rank), then times:
  ours : python -m fr_backend.analyzer DIR --json
  torch: python -m torch.distributed.flight_recorder.fr_trace DIR   (with a timeout)
Peak RSS is read from resource.getrusage(RUSAGE_CHILDREN) of a fresh child per run.

usage: PYTHONPATH=python python scripts/bench_analyzer.py [--ranks 1024] [--entries 2000] [--timeout 300]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = os.path.join(HERE, "..", "python")

CHILD = r"""
import resource, subprocess, sys, time, json
t = time.perf_counter()
try:
    p = subprocess.run(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=float(sys.argv[1]))
    rc, out, err = p.returncode, p.stdout, p.stderr
except subprocess.TimeoutExpired:
    rc, out, err = "timeout", b"", b""
dt = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
rss = ru.ru_maxrss
print(json.dumps({"rc": rc, "s": dt, "rss_kb": rss, "cpu": ru.ru_utime + ru.ru_stime, "out": out.decode(errors="replace"),
                  "err": err.decode(errors="replace")[-1500:]}))
"""


def make_shim(where: str) -> str:
    """A namespace package holding only schema + analyzer (symlinks), so the timing is the analyzer's
    own and not the cost of `import fr_backend` (which imports torch and registers the backend)."""
    pkg = os.path.join(where, "fr_backend")
    os.makedirs(pkg, exist_ok=True)
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
    p = subprocess.run([sys.executable, "-c", CHILD, str(timeout), *cmd], capture_output=True, text=True, env=env)
    return json.loads(p.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--full-package", action="store_true",
                    help="run through `import fr_backend` (adds its torch import) instead of the analyzer-only shim")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="frnccl_bench_")
    root = os.path.join(work, "dumps")
    pypath = os.path.abspath(PY) if a.full_package else make_shim(os.path.join(work, "shim"))
    sys.path.insert(0, pypath)
    try:
        t = time.perf_counter()
        generate(root, a.ranks, a.entries)
        gen_s = time.perf_counter() - t
        size = sum(os.path.getsize(os.path.join(root, f)) for f in os.listdir(root))
        env = dict(os.environ, PYTHONPATH=pypath)
        rows = []
        ours = timed([sys.executable, "-m", "fr_backend.analyzer", root, "--json"], a.timeout, env)
        try:
            f0 = json.loads(ours["out"])["findings"][0]
            verdict = f"{f0['kind']} culprit={f0['culprit_ranks']}"
        except (ValueError, IndexError, KeyError):
            verdict = "unparsed"
        rows.append(("frnccl analyze", ours, verdict))
        if not a.skip_torch:
            th = timed([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", root], a.timeout, env)
            tv = "timeout" if th["rc"] == "timeout" else ("error" if th["rc"] else "ran")
            rows.append(("torch fr_trace", th, tv))
        print(f"input: {a.ranks} ranks x {a.entries} entries, {size / 2**20:.0f} MiB of pickles "
              f"(generated in {gen_s:.0f} s); expected culprit: rank {a.ranks // 2 + 1}; cores: {os.cpu_count()}")
        print(f"load average before: {os.getloadavg()[0]:.1f} (other work on the machine inflates wall time)")
        print(f"{'tool':<16} {'exit':>7} {'wall s':>8} {'CPU s':>7} {'peak RSS MiB':>13}  verdict")
        for name, r, v in rows:
            print(f"{name:<16} {str(r['rc']):>7} {r['s']:>8.1f} {r['cpu']:>7.1f} {r['rss_kb'] / 1024:>13.0f}  {v}")
        for name, r, _ in rows:
            if r["rc"] not in (0, 1):
                print(f"--- {name} stderr tail:\n{r['err'][-600:]}")
    finally:
        if a.keep:
            print("dumps kept in", root, "; PYTHONPATH", pypath)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
