#!/usr/bin/env python3
"""What each CUDA primitive a completion marker could use costs the calling thread, per call.

    python scripts/bench_markers.py [--calls 20000] [--rounds 9] [--json FILE]

frnccl follows a synchronous NCCL op (which returns no Work) with an end event recorded on the
caller's stream; that record is most of frnccl's cost per small op on the GPU host. This script
measures, on GPU 0 and the current torch stream, blocks of `--calls` calls to each primitive,
interleaved over `--rounds` rounds, with the GPU idle and with the stream busy behind a long kernel:

  baseline                 cudaGetLastError (the ctypes call itself; subtracted from the others)
  event record (untimed)   cudaEventRecord on a cudaEventDisableTiming event (frnccl's end event)
  event record (timed)     cudaEventRecord on a timing event (FRNCCL_GPU_TIMING)
  event query              cudaEventQuery (the watchdog's side)
  stream write value       cuStreamWriteValue32 into mapped host memory: a marker the watchdog
                           could read without any driver call

Calls go through ctypes, so each figure carries the same ctypes overhead as the baseline; the
table reports median ns per call and median minus baseline.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

CUDA_EVENT_DEFAULT = 0
CUDA_EVENT_DISABLE_TIMING = 2
CUDA_HOST_ALLOC_MAPPED = 2


def loaded_library(fragment: str) -> ctypes.CDLL:
    """The copy of a CUDA library torch already loaded (the venv's, not whatever the loader finds first)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if fragment in path and path.startswith("/"):
            return ctypes.CDLL(path)
    return ctypes.CDLL(fragment)


def check(what: str, status: int) -> None:
    if status != 0:
        raise SystemExit(f"bench_markers: {what} failed with CUDA error {status}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench_markers: needs a CUDA device")
    torch.cuda.set_device(0)
    torch.ones(1, device="cuda")  # creates the context
    cudart = loaded_library("libcudart")
    libcuda = loaded_library("libcuda.so")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    untimed, timed = ctypes.c_void_p(), ctypes.c_void_p()
    check("cudaEventCreateWithFlags", cudart.cudaEventCreateWithFlags(ctypes.byref(untimed), CUDA_EVENT_DISABLE_TIMING))
    check("cudaEventCreateWithFlags", cudart.cudaEventCreateWithFlags(ctypes.byref(timed), CUDA_EVENT_DEFAULT))
    host, device_ptr = ctypes.c_void_p(), ctypes.c_uint64()
    check("cudaHostAlloc", cudart.cudaHostAlloc(ctypes.byref(host), ctypes.c_size_t(64), CUDA_HOST_ALLOC_MAPPED))
    check("cudaHostGetDevicePointer", cudart.cudaHostGetDevicePointer(ctypes.byref(device_ptr), host, 0))
    write_value = getattr(libcuda, "cuStreamWriteValue32_v2", None) or libcuda.cuStreamWriteValue32
    write_value.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
    record, query, last_error = cudart.cudaEventRecord, cudart.cudaEventQuery, cudart.cudaGetLastError
    record.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    query.argtypes = [ctypes.c_void_p]

    # The write lands in host memory once the stream reaches it.
    check("cuStreamWriteValue32", write_value(stream, device_ptr.value, 12345, 0))
    torch.cuda.synchronize()
    landed = ctypes.c_uint32.from_address(host.value).value
    if landed != 12345:
        raise SystemExit(f"bench_markers: cuStreamWriteValue32 wrote {landed}, expected 12345")

    primitives: dict[str, Callable[[], int]] = {
        "baseline (cudaGetLastError)": lambda: last_error(),
        "event record (untimed)": lambda: record(untimed, stream),
        "event record (timed)": lambda: record(timed, stream),
        "event query": lambda: query(untimed),
        "stream write value": lambda: write_value(stream, device_ptr.value, 1, 0),
    }
    results: dict[str, dict[str, list[float]]] = {state: {name: [] for name in primitives} for state in ("idle", "busy")}
    for r in range(args.rounds):
        names = list(primitives) if r % 2 == 0 else list(primitives)[::-1]
        for state in ("idle", "busy"):
            for name in names:
                call = primitives[name]
                torch.cuda.synchronize()
                if state == "busy":
                    torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time ahead of the calls
                t0 = time.perf_counter_ns()
                for _ in range(args.calls):
                    call()
                results[state][name].append((time.perf_counter_ns() - t0) / args.calls)
    torch.cuda.synchronize()

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, {args.rounds} rounds x {args.calls} calls\n")
    print("| primitive | idle: ns/call | idle: minus baseline | busy stream: ns/call | busy: minus baseline |")
    print("| --- | --- | --- | --- | --- |")
    base = {s: statistics.median(results[s]["baseline (cudaGetLastError)"]) for s in results}
    for name in primitives:
        cells = []
        for state in ("idle", "busy"):
            med = statistics.median(results[state][name])
            cells += [f"{med:.0f}", "" if name.startswith("baseline") else f"{med - base[state]:+.0f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
