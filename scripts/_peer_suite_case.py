"""torch's own distributed test suite as one TestCase, for scripts/peer_suite.py.

`DistributedTest._DistTestBase` (torch/testing/_internal/distributed/distributed_test.py) decides
which tests run, and what they expect, from the backend's name: the module global `BACKEND`, read
from the environment at import. To judge frnccl by the same tests as gloo, the name stays `gloo`
for those gates, and each rank process (`_run`) puts the backend under test where the name is
the backend itself:

- the group the test runs on: `init_process_group(backend="gloo")` creates a frnccl group;
- the tests in NAME_TESTS, which check that the backend's name is the one the suite was started
  with, see `frnccl`.

Groups a test asks for by name (`new_group(backend="gloo")`) stay gloo. Nothing in torch's files
changes. Import this module only with BACKEND (gloo) and UNDER_TEST_ENV set.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import torch.distributed as dist
from torch.testing._internal.distributed import distributed_test
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

UNDER_TEST_ENV = "FRNCCL_PEER_SUITE_BACKEND"
START_ENV = "FRNCCL_PEER_SUITE_START"  # fork (the default) or spawn: how each test's ranks start
GATE_NAME = "gloo"
# Tests whose body compares the backend's name with the suite's BACKEND.
NAME_TESTS = frozenset({"test_get_backend", "test_Backend_enum_class"})


def _under_test() -> str:
    return os.environ.get(UNDER_TEST_ENV, GATE_NAME)


def _route_world_group(backend: str) -> None:
    """Makes the suite's own groups (created with backend=BACKEND) use `backend`."""
    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("backend") == GATE_NAME:
            kwargs["backend"] = backend
        return original(*args, **kwargs)

    dist.init_process_group = init_process_group  # type: ignore[assignment]


class PeerSuite(TestDistBackend, DistributedTest._DistTestBase):
    """torch's test/distributed/test_distributed_spawn.py, with the backend under test routed in."""

    def setUp(self) -> None:
        super().setUp()
        if os.environ.get(START_ENV, "fork") == "fork":
            # Forked from a process that has imported torch and the suite already: a test's ranks start in
            # well under a second, where spawned ones import both again (about 10 s each on a busy 2-core box).
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()  # what torch's own test_distributed_spawn.py does

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str, pipe: Any, **kwargs: Any) -> None:
        backend = _under_test()
        if backend != GATE_NAME:
            _route_world_group(backend)
            if test_name in NAME_TESTS:
                distributed_test.BACKEND = backend
        super()._run(rank, test_name, file_name, pipe, **kwargs)

    def run_test(self, test_name: str, parent_pipe: Any) -> None:
        # A suite that created its group some other way would run gloo and pass for the wrong reason.
        world = dist.get_backend()
        if world != _under_test():
            raise RuntimeError(f"peer_suite: {test_name} runs on {world}, not on {_under_test()}")
        super().run_test(test_name, parent_pipe)
