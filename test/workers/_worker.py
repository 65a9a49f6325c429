"""Shared by the worker scripts: init from env://, compare frnccl with gloo, report.

A `Checks` object runs each case on a reference group (plain gloo) and on the
group under test (frnccl) with identical inputs, and records either a value
match, a matching error (gloo refuses the op and frnccl raises the same kind
of Python exception with gloo's message), or a failure. `report()` prints the
`RESULT <json>` line the pytest side parses.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

# torch 2.13 marks several collectives deprecated; keep rank logs readable.
warnings.filterwarnings("ignore", category=FutureWarning)

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def init(backend: str, timeout_s: float = 60) -> None:
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout_s))


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        for v in value:
            out.extend(_flatten(v))
        return out
    return [value]


def same(a: Any, b: Any) -> bool:
    """Tensors: torch.equal for exact dtypes, allclose for floats; else ==."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
            return False
        if a.device.type == "meta":
            return True
        if a.is_floating_point():
            tol = 1e-2 if a.dtype in (torch.bfloat16, torch.float16) else 1e-6
            return bool(torch.allclose(a.double(), b.double(), rtol=tol, atol=tol, equal_nan=True))
        return bool(torch.equal(a, b))
    return bool(a == b)


class Checks:
    def __init__(self) -> None:
        self.matched: list[str] = []  # value comparisons that held
        self.errors_matched: list[str] = []  # gloo and frnccl raised the same error
        self.failures: list[str] = []
        self.notes: dict[str, Any] = {}

    def fail(self, name: str, why: str) -> None:
        self.failures.append(f"{name}: {why}")

    def expect(self, name: str, cond: bool, why: str = "") -> None:
        if cond:
            self.matched.append(name)
        else:
            self.fail(name, why or "condition false")

    def compare(self, name: str, fn: Callable[[Any], Any], ref: Any, fr: Any) -> None:
        """Run fn(group) on `ref` (gloo) then on `fr` (frnccl); fn returns what to compare."""
        if os.environ.get("FRNCCL_TEST_PROGRESS"):
            print(f"case {name}", flush=True)  # shows where a hung job stopped
        try:
            want = fn(ref)
            ref_err = None
        except Exception as e:  # gloo refuses the op: frnccl must refuse it the same way
            want, ref_err = None, e
        try:
            got = fn(fr)
            fr_err = None
        except Exception as e:
            got, fr_err = None, e
            if ref_err is None:
                self.fail(name, f"frnccl raised, gloo did not: {type(e).__name__}: {e}\n{traceback.format_exc()}")
                return
        if ref_err is not None:
            if fr_err is None:
                self.fail(name, f"gloo raised {type(ref_err).__name__}: {_first_line(ref_err)}; frnccl did not")
            elif type(fr_err) is not type(ref_err) or _first_line(ref_err) not in str(fr_err):
                self.fail(
                    name,
                    f"errors differ: gloo {type(ref_err).__name__}: {_first_line(ref_err)!r}; "
                    f"frnccl {type(fr_err).__name__}: {_first_line(fr_err)!r}",
                )
            else:
                self.errors_matched.append(f"{name}: {_first_line(ref_err)}")
            return
        w, g = _flatten(want), _flatten(got)
        if len(w) != len(g):
            self.fail(name, f"{len(g)} results from frnccl, {len(w)} from gloo")
            return
        for i, (a, b) in enumerate(zip(w, g)):
            if not same(a, b):
                detail = f"result {i} differs: gloo {a!r:.200} vs frnccl {b!r:.200}"
                self.fail(name, detail)
                return
        self.matched.append(name)

    def report(self) -> None:
        print(
            "RESULT "
            + json.dumps(
                {
                    "rank": RANK,
                    "world": WORLD,
                    "matched": self.matched,
                    "errors_matched": self.errors_matched,
                    "failures": self.failures,
                    "notes": self.notes,
                }
            ),
            flush=True,
        )


def finish(checks: Checks, destroy: bool = True) -> None:
    checks.report()
    if destroy:
        dist.destroy_process_group()
    sys.stdout.flush()
