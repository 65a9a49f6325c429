#!/usr/bin/env python3
"""What the slow-rank detector (fr_backend.slow) costs the store host at N ranks, and how soon after the window
that decides it rank 0 names a slow rank.

One real TCPStore server (torch's libuv one, as torchrun's; in a process of its own, with the loopback
resolver of bench_store_coordination.py) gets exactly the detector's requests of N ranks, window after window:
each rank appends its report line (fr_backend.slow.report_line of a rank in three groups, world, tp and dp,
as own_report builds it) to the window's key, and every ACK_EVERY windows checks and reads rank 0's ack.
The lines come from --clients connections (N Python TCPStore clients do not fit one machine; the server's
work is per request and byte, so the figure is of N ranks' requests). Rank 0's side runs the detector's own
code (Detector._judge): one read, the delete, parsing, the judge, the state it posts. From the fifth
window on, rank N/2 is late by 5 ms in its tp and world groups (the others lose 20% of their time to it).

Reported: the server's CPU in steady state (% of one core, from /proc/<pid>/stat over --windows windows), the
requests and bytes a window, rank 0's time from the window's end to its line (its grace, then its read and
judge), and the window in which the slow rank was named.

usage: python scripts/bench_slow_store.py [--sizes 1024,16384] [--window-s 10] [--windows 8] [--clients 64]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from bench_store_coordination import cpu_s, server_cmd  # noqa: E402

from fr_backend.slow import ACK_EVERY, ACK_KEY, Detector, Identity, report_line, window_key  # noqa: E402
from fr_backend.slow_judge import QUANTILES, GroupReport, RankReport  # noqa: E402
from fr_backend.config import SlowSettings  # noqa: E402

TP = 8
OPS_PER_S = 40  # collectives per second in each group
LATE_S = 0.005  # the slow rank's lateness: the others lose 20% of their time to it


def report(rank: int, n: int, window: int, slow_from: int, window_s: float) -> RankReport:
    ops = int(OPS_PER_S * window_s)

    def g(name: str, size: int, r: int, wait: float) -> GroupReport:
        return GroupReport(name, name, size, r, "all_reduce", ops, tuple(wait + 0.0002 * q for q in QUANTILES),
                           wait * OPS_PER_S)

    slow = window >= slow_from
    late = rank == n // 2 and slow
    row = rank // TP
    tp_wait = 0.001 + (LATE_S if slow and not late and row == (n // 2) // TP else 0.0)
    world_wait = 0.001 + (LATE_S if slow and not late else 0.0)
    groups = (g("0", n, rank, world_wait), g(f"tp{row}", TP, rank % TP, tp_wait),
              g(f"dp{rank % TP}", n // TP, row, 0.001))
    return RankReport(rank, f"node-{rank // 8}", 1000 + rank, (world_wait + tp_wait + 0.001) * ops / window_s, groups)


def client_main(port: int, ranks: range, n: int, window_s: float, windows: int, first: int, slow_from: int,
                clients: int, ready, go) -> None:
    from torch.distributed import TCPStore

    stores = [TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120), wait_for_workers=False)
              for _ in range(clients)]
    lines = {w: [report_line(report(r, n, w, slow_from, window_s)) for r in ranks] for w in range(first, first + windows)}
    ready.set()
    go.wait()
    for w in range(first, first + windows):
        end = (w + 1) * window_s
        time.sleep(max(0.0, end - time.time()))
        for i, line in enumerate(lines[w]):
            store = stores[i % clients]
            if w % ACK_EVERY == 0 and store.check([ACK_KEY]):
                store.get(ACK_KEY)
            store.append(window_key(w), line)


def one(n: int, window_s: float, windows: int, clients: int, procs: int) -> dict:
    import subprocess

    from torch.distributed import TCPStore

    server = subprocess.Popen(server_cmd(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        judge_store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120), wait_for_workers=False)
        first = int(time.time() // window_s) + 3
        slow_from = first + 4  # the judge's baseline is the first 3 windows
        ready = [multiprocessing.Event() for _ in range(procs)]
        go = multiprocessing.Event()
        bounds = [n * i // procs for i in range(procs + 1)]
        workers = [multiprocessing.Process(target=client_main, args=(port, range(lo, hi), n, window_s, windows, first,
                                                                     slow_from, max(1, clients // procs), ready[i], go))
                   for i, (lo, hi) in enumerate(zip(bounds, bounds[1:]))]
        for w in workers:
            w.start()
        for e in ready:
            e.wait(300)
        go.set()
        detector = Detector(SlowSettings(True, window_s, 0.05), Identity(0, n), judge_store)
        detector._connect()
        said: list[tuple[int, str]] = []
        import fr_backend.slow as slow

        slow._say = lambda line: said.append((current[0], line))  # type: ignore[assignment]
        current = [0]
        grace = min(2.0, window_s / 4)
        cpu = []
        after_end = []
        judge_s: list[tuple[float, float]] = []
        for w in range(first, first + windows):
            end = (w + 1) * window_s
            time.sleep(max(0.0, end + grace - time.time()))
            cpu.append((cpu_s(server.pid), time.monotonic()))
            current[0] = w
            t0, c0 = time.perf_counter(), time.process_time()
            detector._judge(w)
            judge_s.append((time.perf_counter() - t0, time.process_time() - c0))
            after_end.append(time.time() - end)
        for w in workers:
            w.join(120)
        steady = cpu[2:]  # after the first windows' connection setup
        cpu_pct = 100 * (steady[-1][0] - steady[0][0]) / (steady[-1][1] - steady[0][1])
        named = [(w - slow_from, line) for w, line in said if "enters" in line]
        return {"n": n, "window_s": window_s, "server_cpu_pct": round(cpu_pct, 2),
                "requests_per_window": round(n * (1 + 2 / ACK_EVERY)),
                "bytes_per_window": n * len(report_line(report(0, n, first, slow_from, window_s))),
                "line_after_window_end_s": round(max(after_end[4:] or after_end), 2),
                "judge_wall_s": round(max(w for w, _ in judge_s[2:]), 2),
                "judge_cpu_s": round(max(c for _, c in judge_s[2:]), 2),
                "named_in_window": named[0][0] if named else None, "named": named[0][1][:160] if named else None}
    finally:
        server.stdin.close()
        server.wait(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,16384")
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--procs", type=int, default=4)
    args = ap.parse_args()
    print("| ranks | window | store server CPU, steady (% of a core) | requests a window | bytes a window | "
          "rank 0's judging, wall / CPU (s, max) | rank 0's line after the window's end (s) | named (windows after the slowdown) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in (int(x) for x in args.sizes.split(",")):
        r = one(n, args.window_s, args.windows, args.clients, args.procs)
        print(f"| {r['n']} | {r['window_s']:g} s | {r['server_cpu_pct']} | {r['requests_per_window']} | "
              f"{r['bytes_per_window']} | {r['judge_wall_s']} / {r['judge_cpu_s']} | {r['line_after_window_end_s']} | "
              f"{r['named_in_window']} |", flush=True)
        print(f"  {r['named']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
