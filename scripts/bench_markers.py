#!/usr/bin/env python3
"""What each CUDA primitive a completion marker could use costs the calling thread, per call.

    python scripts/bench_markers.py [--calls 20000] [--rounds 9] [--json FILE]

frnccl follows a synchronous NCCL op (which returns no Work) with an end event recorded on the
caller's stream; that record is most of frnccl's cost per small op on the GPU host. This script
measures, on GPU 0 and the current torch stream, blocks of `--calls` calls to each primitive,
interleaved over `--rounds` rounds, with the GPU idle and with the stream busy behind a long kernel:

  baseline                 cudaGetLastError (the ctypes call itself; subtracted from the others)
  event record (untimed)   cudaEventRecord on a cudaEventDisableTiming event
  ... (driver API)         cuEventRecord, the driver's entry point, on the same event: what frnccl's
                           op path calls (the runtime's call checks its own thread state first)
  event record (timed)     cudaEventRecord on a timing event (FRNCCL_GPU_TIMING)
  ... (pool of 1024)       untimed or timed, taking 1024 events in turn, as frnccl's marker pool
                           does: an event is not recorded again while its last record may be pending
  event query              cudaEventQuery (the watchdog's side)
  stream query             cudaStreamQuery on the caller's stream: whether everything placed on it so far
                           has finished, which a marker could ask before an op instead of recording after it
  stream write value       cuStreamWriteValue32 into mapped host memory: a marker the watchdog
                           could read without any driver call
  stamp kernel             cuLaunchKernel of a one-thread kernel that writes the GPU's %globaltimer into
                           mapped host memory: a GPU time without a timed event

Calls go through ctypes, so each figure carries the same ctypes overhead as the baseline; the
table reports median ns per call and median minus baseline.

A second table gives what an event costs the GPU: blocks of short kernels (about 10 µs each, queued far
ahead of the GPU) with nothing, an untimed event, or one or two timed events between consecutive
kernels, timed from the first kernel's start to the last one's end; the figure is the extra GPU time per
kernel against the block without events.
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
# One thread stores the GPU's nanosecond timer (%globaltimer) at the address it is given: a GPU time
# placed in stream order without a timed event.
STAMP_PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry frnccl_stamp(.param .u64 out)
{
  .reg .b64 %rd<3>;
  ld.param.u64 %rd1, [out];
  mov.u64 %rd2, %globaltimer;
  st.volatile.global.u64 [%rd1], %rd2;
  ret;
}
"""


def loaded_library(fragment: str) -> ctypes.CDLL:
    """The copy of a CUDA library torch already loaded (the venv's, not whatever the loader finds first)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if fragment in path and path.startswith("/"):
            return ctypes.CDLL(path)
    return ctypes.CDLL(fragment)


def check(what: str, status: int) -> None:
    if status != 0:
        raise SystemExit(f"{Path(sys.argv[0]).stem}: {what} failed with CUDA error {status}")


def create_events(cudart: ctypes.CDLL, count: int, flags: int) -> list[ctypes.c_void_p]:
    events = []
    for _ in range(count):
        event = ctypes.c_void_p()
        check("cudaEventCreateWithFlags", cudart.cudaEventCreateWithFlags(ctypes.byref(event), flags))
        events.append(event)
    return events


class StampKernel:
    """Launches the stamp kernel on a stream into `slots` mapped host slots, each launch one ctypes call."""

    def __init__(self, cudart: ctypes.CDLL, libcuda: ctypes.CDLL, stream: ctypes.c_void_p, slots: int) -> None:
        module, self.fn = ctypes.c_void_p(), ctypes.c_void_p()
        check("cuModuleLoadData", libcuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(STAMP_PTX)))
        check("cuModuleGetFunction", libcuda.cuModuleGetFunction(ctypes.byref(self.fn), module, b"frnccl_stamp"))
        host, device_ptr = ctypes.c_void_p(), ctypes.c_uint64()
        check("cudaHostAlloc", cudart.cudaHostAlloc(ctypes.byref(host), ctypes.c_size_t(8 * slots), CUDA_HOST_ALLOC_MAPPED))
        check("cudaHostGetDevicePointer", cudart.cudaHostGetDevicePointer(ctypes.byref(device_ptr), host, 0))
        self.values = (ctypes.c_uint64 * slots).from_address(host.value)
        self._args = [ctypes.c_uint64(device_ptr.value + 8 * i) for i in range(slots)]
        self._params = [(ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(a), ctypes.c_void_p)) for a in self._args]
        self._launch = libcuda.cuLaunchKernel
        self._launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        self._stream = stream

    def __call__(self, slot: int) -> int:
        return self._launch(self.fn, 1, 1, 1, 1, 1, 1, 0, self._stream, self._params[slot], None)


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
    driver_record = libcuda.cuEventRecord
    driver_record.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    check("cuEventRecord", driver_record(untimed, stream))
    query.argtypes = [ctypes.c_void_p]
    stream_query = cudart.cudaStreamQuery
    stream_query.argtypes = [ctypes.c_void_p]

    stamper = StampKernel(cudart, libcuda, stream, 2)
    check("cuLaunchKernel", stamper(0))
    torch.cuda.synchronize()
    if stamper.values[0] == 0:
        raise SystemExit("bench_markers: the stamp kernel wrote no time")
    # The write lands in host memory once the stream reaches it.
    check("cuStreamWriteValue32", write_value(stream, device_ptr.value, 12345, 0))
    torch.cuda.synchronize()
    landed = ctypes.c_uint32.from_address(host.value).value
    if landed != 12345:
        raise SystemExit(f"bench_markers: cuStreamWriteValue32 wrote {landed}, expected 12345")

    def event_pool(flags: int, size: int = 1024) -> Callable[[], int]:
        events = create_events(cudart, size, flags)
        turn = [0]

        def record_next() -> int:
            turn[0] = (turn[0] + 1) % size
            return record(events[turn[0]], stream)

        return record_next

    primitives: dict[str, Callable[[], int]] = {
        "baseline (cudaGetLastError)": lambda: last_error(),
        "event record (untimed)": lambda: record(untimed, stream),
        "event record (untimed, driver API)": lambda: driver_record(untimed, stream),
        "event record (untimed, pool of 1024)": event_pool(CUDA_EVENT_DISABLE_TIMING),
        "event record (timed)": lambda: record(timed, stream),
        "event record (timed, pool of 1024)": event_pool(CUDA_EVENT_DEFAULT),
        "event query": lambda: query(untimed),
        "stream query": lambda: stream_query(stream),
        "stream write value": lambda: write_value(stream, device_ptr.value, 1, 0),
        "stamp kernel": lambda: stamper(0),
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
    second_timed = ctypes.c_void_p()
    check("cudaEventCreateWithFlags", cudart.cudaEventCreateWithFlags(ctypes.byref(second_timed), CUDA_EVENT_DEFAULT))
    gpu_side = gpu_cost_per_kernel(torch, record, untimed, (timed, second_timed), stamper, stream, args.rounds)
    print("\nGPU time added per kernel (about 10 µs kernels, 200 per block), median over rounds [min-max]:\n")
    print("| between consecutive kernels | µs added per kernel |")
    print("| --- | --- |")
    for name, values in gpu_side.items():
        print(f"| {name} | {statistics.median(values):+.2f} [{min(values):+.2f} to {max(values):+.2f}] |")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu_ns_per_call": results, "gpu_us_added_per_kernel": gpu_side}))


def gpu_cost_per_kernel(torch, record, untimed, timed: tuple, stamper: StampKernel, stream,
                        rounds: int) -> dict[str, list[float]]:
    """Extra GPU time per kernel when events are recorded between kernels, against none."""
    kernels, cycles = 200, 20_000  # torch.cuda._sleep spins this many clocks: about 10 µs

    def block(between: Callable[[], None]) -> float:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(20_000_000)  # keeps the GPU busy while the block is queued behind it
        begin.record()
        for _ in range(kernels):
            torch.cuda._sleep(cycles)
            between()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) * 1000.0 / kernels

    variants: dict[str, Callable[[], None]] = {
        "nothing": lambda: None,
        "untimed event": lambda: record(untimed, stream),
        "timed event": lambda: record(timed[0], stream),
        "two timed events": lambda: (record(timed[0], stream), record(timed[1], stream)),
        "stamp kernel": lambda: stamper(0),
        "two stamp kernels": lambda: (stamper(0), stamper(1)),
    }
    per: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        names = list(variants) if r % 2 == 0 else list(variants)[::-1]
        for name in names:
            per[name].append(block(variants[name]))
    base = per.pop("nothing")
    return {name: [v - b for v, b in zip(values, base)] for name, values in per.items()}


if __name__ == "__main__":
    sys.exit(main())
