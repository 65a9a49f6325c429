"""A job whose store is a FileStore (file:// init) keeps polling once a second, as before the push: a FileStore's
wait() is no push, it opens, locks and reads the shared file every 10 ms for as long as it waits.

The test watches the store file with inotify (Linux) and counts how often the idle ranks open it."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import sys
import threading
import time

import pytest

from dist_harness import JobThread, run_ranks, wait_for

pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")

WORLD = 2
IDLE_S = 4.0
IN_OPEN = 0x20
# Watched too, though not counted: inotify merges an event into an identical one not yet read, and the
# closes in between keep successive opens from being merged.
IN_CLOSE = 0x08 | 0x10
# The monitor's poll (FRNCCL_COORD_CHECK_MS, 1 s): a few store calls a second, each one open of the file.
# A FileStore wait() opens it about 100 times a second.
MAX_OPENS_PER_RANK_S = 10


class OpenCounter:
    """Counts the opens of one file (inotify IN_OPEN events), read as they come by a thread of its own."""

    def __init__(self, path: str) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, "inotify_init1 failed"
        assert libc.inotify_add_watch(self.fd, path.encode(), IN_OPEN | IN_CLOSE) >= 0, "inotify_add_watch failed"
        self.opens = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self.stopped.is_set():
            if not select.select([self.fd], [], [], 0.1)[0]:
                continue
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                continue
            pos = 0
            while pos < len(data):
                _wd, mask, _cookie, length = struct.unpack_from("iIII", data, pos)
                self.opens += bool(mask & IN_OPEN)
                pos += 16 + length

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(5)
        os.close(self.fd)


def test_idle_job_on_a_file_store_does_not_read_it_every_10ms(tmp_path):
    store_file = str(tmp_path / "store")
    flags = tmp_path / "flags"
    flags.mkdir()
    env = {"FRNCCL_DUMP_DIR": str(tmp_path / "dumps")}
    job = JobThread(lambda: run_ranks("store_file_idle.py", WORLD, store_file, str(flags), timeout=120, env=env))
    try:
        wait_for(lambda: all((flags / f"ready-{r}").exists() for r in range(WORLD)), 90, "the ranks", job)
        counter = OpenCounter(store_file)
        time.sleep(2.0)  # every rank's monitor past its first look
        before = counter.opens
        t0 = time.monotonic()
        time.sleep(IDLE_S)
        opens = counter.opens - before
        per_rank_s = opens / WORLD / (time.monotonic() - t0)
        counter.close()
    finally:
        (flags / "done").touch()
    done = job.finish().assert_ok()
    print(f"idle: {opens} opens of the store file in {IDLE_S} s ({per_rank_s:.1f} per rank per second)")
    assert opens > 0, "no open of the store file seen: the watch saw nothing"
    assert per_rank_s <= MAX_OPENS_PER_RANK_S, (
        f"idle ranks opened the store file {per_rank_s:.0f} times a second each (allowed: {MAX_OPENS_PER_RANK_S})\n"
        + done.describe())
