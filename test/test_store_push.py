"""Coordination through the store without idle load: a healthy idle job sends its TCPStore (next to)
no requests, and a job-wide dump request still reaches every rank within 2 s.

The job's store is hosted by the test, behind a proxy that parses and counts every request the ranks
send (store_proxy.py). Before the push, every rank's monitor read the store every FRNCCL_COORD_CHECK_MS
(1 s, the default, which the idle test keeps): one to three requests per rank per second. The request
test sets the poll interval to a minute, so a request seen within 2 s was pushed, not polled."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest

from dist_harness import JobThread, run_ranks, wait_for
from store_proxy import StoreProxy

torch_dist = pytest.importorskip("torch.distributed")

WORLD = 3
IDLE_S = 6.0
# The old pattern's count over the idle window, at its lowest (one request per rank per second), and 1% of it.
POLL_PATTERN_REQUESTS = WORLD * IDLE_S
MAX_IDLE_REQUESTS = int(0.01 * POLL_PATTERN_REQUESTS)


def start_job(tmp_path, seed: dict[str, str] | None = None, **extra: str):
    """The job, its store (hosted here, holding `seed` before any rank starts) and the proxy the ranks reach it
    through."""
    server = torch_dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30),
                                 wait_for_workers=False, use_libuv=True)
    for key, value in (seed or {}).items():
        server.set(key, value)
    proxy = StoreProxy(server.port)
    env = {"FRNCCL_DUMP_DIR": str(tmp_path / "dumps"), "FRNCCL_DUMP_TIMEOUT_SEC": "20", **extra}
    job = JobThread(lambda: run_ranks("store_idle.py", WORLD, str(proxy.port), timeout=120, env=env))
    return server, proxy, job, tmp_path / "dumps"


@pytest.fixture
def idle_job(request, tmp_path):
    server, proxy, job, dumps = start_job(tmp_path, **getattr(request, "param", {}))
    yield server, proxy, job, dumps
    server.set("test/done", "1")
    try:
        job.finish()
    finally:
        proxy.close()


def publish(store, incident: str, reason: str) -> None:
    """A job-wide request, as `frnccl dump --store` publishes it (fr_backend.live_dump.publish): the lock, the
    request number, the request, every rank's wake key."""
    assert store.compare_set("frnccl/active", "", f"{incident}|{time.time_ns()}").decode().startswith(incident)
    seq = int(store.add("frnccl/incident_seq", 1))
    store.set(f"frnccl/incident/{seq}", f"{incident}\nmanual\n-1\n{reason}")
    store.multi_set([f"frnccl/wake/{r}" for r in range(WORLD)], ["1"] * WORLD)


# A test bound under a second is ignored: at 1 ms every idle rank would wake itself on every monitor tick.
@pytest.mark.parametrize("idle_job", [{}, {"FRNCCL_TEST_WAIT_BOUND_MS": "1"}], indirect=True, ids=["default", "tiny_bound"])
def test_idle_job_sends_the_store_no_requests(idle_job):
    server, proxy, job, _ = idle_job
    # Every rank's group is up, and its monitor has had a few seconds to settle (its first look, its wait).
    wait_for(lambda: _ready(server), 90, "the ranks", job)
    time.sleep(3.0)
    before = proxy.snapshot()
    time.sleep(IDLE_S)
    during = proxy.snapshot() - before
    assert proxy.unparsed == 0, "the proxy could not parse a client's requests"
    print(f"idle {IDLE_S} s: {dict(during)}; {proxy.connections} connections")
    assert sum(during.values()) <= MAX_IDLE_REQUESTS, (
        f"an idle {WORLD}-rank job sent the store {dict(during)} in {IDLE_S} s "
        f"(the poll-every-second pattern: at least {POLL_PATTERN_REQUESTS:.0f}; allowed: {MAX_IDLE_REQUESTS})")
    assert proxy.connections >= 2 * WORLD, f"only {proxy.connections} connections went through the proxy"


def test_idle_job_sends_no_requests_after_a_status(idle_job):
    """Once `frnccl status` asked (every rank answered), the job is idle again: its ranks look for status
    requests only when woken, so the store gets no more requests than before anyone asked."""
    from fr_backend.status import ask

    server, proxy, job, _ = idle_job
    wait_for(lambda: _ready(server), 90, "the ranks", job)
    st = ask(f"127.0.0.1:{server.port}", WORLD, 30.0)  # straight to the store: the proxy counts the ranks only
    assert sorted(st.answered) == list(range(WORLD)), f"ranks {st.missing()} did not answer"
    time.sleep(3.0)  # past the answers and every rank's settling, as in the idle test above
    before = proxy.snapshot()
    time.sleep(IDLE_S)
    during = proxy.snapshot() - before
    assert proxy.unparsed == 0, "the proxy could not parse a client's requests"
    assert sum(during.values()) <= MAX_IDLE_REQUESTS, (
        f"an idle {WORLD}-rank job sent the store {dict(during)} in {IDLE_S} s after a status (allowed: {MAX_IDLE_REQUESTS})")


@pytest.mark.parametrize("idle_job", [{"FRNCCL_COORD_CHECK_MS": "60000"}], indirect=True)
def test_request_reaches_every_rank_within_2s(idle_job):
    server, proxy, job, dumps = idle_job
    wait_for(lambda: _ready(server), 90, "the ranks", job)
    time.sleep(3.0)  # past every rank's first look at the store: from here on only a push reaches it
    incident = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-manual-test"
    t0 = time.monotonic()
    publish(server, incident, "push test")
    key = f"frnccl/written/{incident}"
    wait_for(lambda: server.check([key]) and int(server.get(key)) >= WORLD, 30, "every rank's dump", job, poll_s=0.01)
    all_written_s = time.monotonic() - t0
    server.delete_key("frnccl/active")
    server.set("test/done", "1")
    done = job.finish().assert_ok()
    # How long each rank took to write (its log line): what is left of the wait is how long the request took
    # to reach the last rank.
    write_ms = [float(m.group(1)) for r in done.ranks
                for m in re.finditer(rf"wrote dump {re.escape(incident)} .* in (\d+) ms", r.output)]
    assert len(write_ms) == WORLD, done.describe()
    reached_s = all_written_s - max(write_ms) / 1000
    print(f"reached every rank within {reached_s:.3f} s (all written in {all_written_s:.3f} s)")
    assert reached_s < 2.0, (f"the request reached the last rank {reached_s:.2f} s after it was published "
                             f"(all written after {all_written_s:.2f} s)\n" + done.describe())
    assert len(list((dumps / incident / "compact").iterdir())) == WORLD


def _ready(server) -> bool:
    """Every rank's group is up and ran its all_reduces (each rank counts itself in `test/ready`)."""
    return int(server.add("test/ready", 0)) >= WORLD


def test_store_host_leaving_prints_no_backtrace(tmp_path):
    """env:// puts the store's server in rank 0's process; when it leaves first, the other ranks print at most
    frnccl's one line about the store, no torch backtrace (docs/design.md: a call to a host that left "would
    print torch's warning with a C++ backtrace", which frnccl avoids)."""
    job = run_ranks("store_host_leaves.py", 2, timeout=120, env={"FRNCCL_DUMP_DIR": str(tmp_path / "dumps")})
    rank1 = job.ranks[1]
    assert rank1.returncode == 0 and "DONE 1" in rank1.output, job.describe()
    assert "Exception raised from" not in rank1.output and "frame #" not in rank1.output, rank1.output


def test_left_ranks_list_stays_bounded_across_restarts(tmp_path):
    """Each leaving appends `+<rank>,` to frnccl/left_ranks and each return `-<rank>,`: in the store of a job that
    restarts (torchrun's lives as long as torchrun) or makes its group again, the list grew by two entries per
    rank each time, read whole by every trigger. Rank 0 rewrites it a few seconds after it registered again;
    the ranks that are still out stay in it. (A first attempt costs no read: the idle test above.)"""
    # What 2,000 earlier attempts left behind, a rank of a bigger earlier world (7) that is still out, and the
    # ranks of this job, back since (their `-` is the last word on them) or back now (rank 0).
    history = "".join(f"+{r},-{r}," for _ in range(2000) for r in range(WORLD)) + "+7,-0,+9,-9,"
    # Rank 0 left last time (as its `+0,` says): it takes its mark back, and so knows the list has a history.
    server, proxy, job, _ = start_job(tmp_path, seed={"frnccl/left_ranks": history + "+0,", "frnccl/left/0": "1",
                                                      "frnccl/left_count": "1"})
    try:
        wait_for(lambda: _ready(server), 90, "the ranks", job)
        wait_for(lambda: len(server.get("frnccl/left_ranks")) < 100, 30, "frnccl/left_ranks to be rewritten", job)
        assert server.get("frnccl/left_ranks").decode() == "+7,"
    finally:
        server.set("test/done", "1")
        try:
            job.finish().assert_ok()
        finally:
            proxy.close()


WAIT_BOUND_S = 2.0


@pytest.mark.parametrize("idle_job", [{"FRNCCL_TEST_WAIT_BOUND_MS": str(int(WAIT_BOUND_S * 1000))}], indirect=True)
def test_idle_rank_wakes_itself_before_its_wait_times_out(idle_job):
    """torch logs two warning lines for every TCPStore wait() that times out ('likely a timeout', 'timed out
    after'): 32,768 lines of a timeout every bound at 16,384 healthy idle ranks. Each rank's monitor sets its own
    wake key at 75-87.5% of the bound, so the wait ends as woken. The bound is shortened to seconds here."""
    server, proxy, job, _ = idle_job
    wait_for(lambda: _ready(server), 90, "the ranks", job)
    before = proxy.snapshot()
    time.sleep(4 * WAIT_BOUND_S)  # what is tested is what the ranks do over several bounds
    during = proxy.snapshot() - before
    server.set("test/done", "1")
    done = job.finish().assert_ok()
    out = "\n".join(r.output for r in done.ranks)
    assert "likely a timeout" not in out and "timed out after" not in out, done.describe()
    # Each rank set its own key about once every 1.5-1.75 s: a few sets each, and nothing like a poll.
    assert during["SET"] >= 2 * WORLD, dict(during)
    assert sum(during.values()) <= 8 * 4 * WORLD, dict(during)
