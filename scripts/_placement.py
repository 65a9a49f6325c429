"""Where a benchmark rank's threads run: the same cores for every job, so jobs differ only in what they run.

On the GPU host, a job whose ops do more work spent a fifth less of its calling thread's CPU per op than
another's (docs/benchmarks.md, twelfth run): the scheduler places each process's threads anew, on cores
near or far from its GPU, alone or beside a busy thread, for the process's life. bench_overhead.py --turns' jobs take
turns, so they can all use the same cores: rank r's calling thread alone on one CPU near GPU r (no other
thread of any job on that physical core), every other thread (torch's, NCCL's, frnccl's) on the rest of
rank r's CPUs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MAIN_CPU_ENV = "BENCH_MAIN_CPU"  # the calling thread's CPU
OTHER_CPUS_ENV = "BENCH_OTHER_CPUS"  # every other thread's CPUs, comma-separated


@dataclass(frozen=True)
class Placement:
    main: int
    others: tuple[int, ...]

    def env(self) -> dict[str, str]:
        return {MAIN_CPU_ENV: str(self.main), OTHER_CPUS_ENV: ",".join(map(str, self.others))}

    def describe(self) -> str:
        return f"CPU {self.main} (other threads on {len(self.others)} CPUs)"


def parse_cpu_list(text: str) -> set[int]:
    """'0-3,8,10-11' (sysfs' format) -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def _read_cpu_list(path: Path) -> set[int]:
    try:
        return parse_cpu_list(path.read_text())
    except (OSError, ValueError):
        return set()


def gpu_local_cpus(index: int) -> set[int]:
    """The CPUs of GPU `index`'s NUMA node, from sysfs; empty where that cannot be read."""
    try:
        import torch

        props = torch.cuda.get_device_properties(index)
        bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except (AttributeError, RuntimeError, AssertionError):
        return set()
    return _read_cpu_list(Path("/sys/bus/pci/devices", bus, "local_cpulist"))


def core_siblings(cpu: int) -> set[int]:
    """The CPUs sharing `cpu`'s physical core (itself included)."""
    return _read_cpu_list(Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")) or {cpu}


def rank_placements(world: int, gpu: bool) -> list[Placement] | None:
    """One placement per rank on this machine, or None where it has too few CPUs to keep the ranks apart."""
    allowed = sorted(os.sched_getaffinity(0))
    local = [sorted(set(allowed) & gpu_local_cpus(r)) if gpu else [] for r in range(world)]
    return plan_placements(allowed, local, core_siblings)


def plan_placements(allowed: list[int], local: list[list[int]],
                    siblings: Callable[[int], set[int]]) -> list[Placement] | None:
    """Rank r takes `local[r]` (the CPUs near its GPU) or, where that is empty, the r-th slice of `allowed`;
    ranks with the same `local` split it. Its calling thread gets the first such CPU whose physical core no
    earlier rank's calling thread uses, and no other thread runs on any calling thread's physical core."""
    world = len(local)
    slices = []
    for r in range(world):
        sharing = [q for q in range(world) if local[q] == local[r]]
        pool = local[r] or allowed
        width = len(pool) // len(sharing)
        i = sharing.index(r)
        slices.append(pool[i * width:(i + 1) * width])
    reserved: set[int] = set()
    mains = []
    for cpus in slices:
        main = next((c for c in cpus if c != 0 and c not in reserved), None)  # CPU 0 takes most interrupts
        if main is None:
            return None
        mains.append(main)
        reserved |= siblings(main)
    placements = []
    for main, cpus in zip(mains, slices):
        others = tuple(c for c in cpus if c not in reserved)
        if len(others) < 2:
            return None
        placements.append(Placement(main, others))
    return placements


def pin_other_threads() -> None:
    """At a rank's start, before it makes threads: every thread it makes later starts on the other CPUs."""
    others = os.environ.get(OTHER_CPUS_ENV)
    if others:
        os.sched_setaffinity(0, {int(c) for c in others.split(",")})


def pin_calling_thread() -> None:
    """Once the rank's threads exist (after its warm-up): the calling thread alone on its CPU."""
    main = os.environ.get(MAIN_CPU_ENV)
    if main:
        os.sched_setaffinity(0, {int(main)})
