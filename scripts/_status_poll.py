"""`frnccl status` asked once a second of a running job, from a thread of the bench's driver: what polling the
live view costs the job (scripts/bench_overhead.py --poll-status).

The poller calls fr_backend.status.ask, the function the CLI runs, in one long-lived process: a user's watch
loop would start the CLI on another host, and here a fresh interpreter (torch's import, seconds of CPU) every
second would load the machine's few cores and measure that instead of the job's cost of answering.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field


@dataclass
class PollStats:
    asks: int = 0  # requests that reached the job (its store answered and named a job)
    full: int = 0  # of those, answered by every rank
    not_yet: int = 0  # the store was not up, or the job not registered yet or gone
    seconds: list[float] = field(default_factory=list)  # time to each full answer

    def line(self) -> str:
        med = f"{statistics.median(self.seconds) * 1000:.0f} ms" if self.seconds else "-"
        return f"{self.asks} asks ({self.full} answered by every rank, median {med}), {self.not_yet} before/after the job"


class StatusPoller:
    """Asks the job at 127.0.0.1:``port`` once a second until stop(); a thread of its own, owned by this object."""

    def __init__(self, port: int, world: int, period_s: float = 1.0) -> None:
        self.port, self.world, self.period_s = port, world, period_s
        self.stats = PollStats()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="status-poller", daemon=True)

    def __enter__(self) -> "StatusPoller":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        from fr_backend import status
        from fr_backend.live_dump import LiveDumpError

        nxt = time.monotonic()
        while not self._stop.is_set():
            try:
                st = status.ask(f"127.0.0.1:{self.port}", self.world, 2.0)
            except (LiveDumpError, RuntimeError):  # the job's store not up yet, or gone
                self.stats.not_yet += 1
            else:
                self.stats.asks += 1
                if not st.missing():
                    self.stats.full += 1
                    self.stats.seconds.append(st.seconds)
            nxt += self.period_s
            self._stop.wait(max(0.0, nxt - time.monotonic()))
