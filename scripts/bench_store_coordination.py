#!/usr/bin/env python3
"""What N ranks' dump coordination costs one TCPStore server: frnccl's push against the poll-every-second
pattern, simulated on loopback.

One real TCPStore server (torch's libuv one, as torchrun's) runs in a process of its own. N simulated ranks
are N client connections, driven by one process with an epoll loop, speaking the TCPStore wire protocol
themselves (a Python TCPStore object and a thread per rank do not fit 16,384 times in this machine), and
making exactly the requests the monitor makes:

  poll  torch's ProcessGroupNCCL HeartbeatMonitor: every TORCH_NCCL_COORD_CHECK_MILSEC (1 s), each rank
        checks the store's dump key (`check`); frnccl did the same before the push (its look was a
        `check` of frnccl/incident_seq, plus a `wait` and a `get` once any incident had been asked for).
        On seeing the key, a rank writes its part; to name the ranks that did not, the trigger asked the
        store about each rank (`check` of frnccl/wrote/<id>/<rank>, then frnccl/left/<rank>): 2 round
        trips per missing rank, 1 per writer. torch itself counts no writers.
  push  frnccl now: each rank deletes its key frnccl/wake/<rank> and blocks in `wait` on it. The trigger
        takes the request number (`add`), publishes the request (`set`) and sets every wake key
        (`multiSet`, 1,024 keys a request). A woken rank deletes its key, reads the request number and the
        request (a `compareSet` each that sets nothing), appends its rank to frnccl/writers/<id>, counts
        itself (`add`) and waits again. The trigger names the missing ranks from two reads (frnccl/writers/<id>,
        frnccl/left_ranks), whatever N.
        With the verdict: a woken rank first posts its summary (`set` of frnccl/summary/<id>/<rank>, about
        1 KB as a rank of a job with three groups writes it); once every writer counted, the trigger reads
        the summaries (`multiGet`, 1,024 keys a call), computes the verdict with frnccl's own C++
        (fr_backend._C._compute_verdict, as the monitor thread does), posts its first line and sets every
        wake key again; each rank, woken, reads the verdict (a `compareSet` that sets nothing) and waits again.
  status `frnccl status` on a live job: ranks wait as in push. The real status client (fr_backend.status.ask,
        what `frnccl status --store HOST:PORT --json` runs) bumps frnccl/status/seq and sets every wake key;
        a woken rank answers as MonitorCoordination.cpp's answerStatus: deletes its wake key, reads the
        incident number (pollStore), checks and reads frnccl/status/seq (a `check`, a `compareSet` that sets
        nothing), sets frnccl/status/rank/<rank> to {"n":N,"summary":{...}} (its live summary, ~1 KB) and
        waits again. Reported (median of --status-asks requests): the time to a full answer, ranks answered,
        the server's CPU, the ranks' requests and bytes, and the client's own requests and bytes read.

Reported per N and pattern: the server's CPU while idle (utime+stime from /proc/<pid>/stat, % of one core),
the latency of an unrelated store call (`add` on a key of its own, from a Python TCPStore client, as the
rendezvous makes) while idle, how long until every simulated rank saw a dump request (its `check` answered
READY, or its `wait` returned; the woken ranks' own follow-up requests go out as they are woken, as they
would from N processes, but here one Python process reads all N sockets, which is most of that time at
16,384), the server's CPU from the request until every writer's requests were answered, and how long the
trigger takes to count the writers and name the missing ones (1% of the ranks do not write); for push, the
verdict: from the writers counted to its line posted (reads, compute), until every rank has read it, and what
it adds to the store (requests, bytes and server CPU).

usage: python scripts/bench_store_coordination.py [--sizes 1024,4096,16384] [--idle-s 10] [--patterns poll,push,status]
       [--rank-procs K]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import resource
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta

# torch/csrc/distributed/c10d/TCPStoreBackend.hpp
VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND = range(10)
MAGIC = 0x3C85F7CE
# Reply sizes: how many bytes each request answers with; GET: u64 length + value.
# STATUS_N: a compareSet reply (as GET) whose value, the status request's number, the rank's answer needs.
STATUS_N = 100
REPLY = {CHECK: 1, WAIT: 1, DELETE_KEY: 8, ADD: 8, GET: -1, STATUS_N: -1}
DUMP_KEY = "NCCL_DUMP"  # torch's kStoreDumpKey is of this kind: one key every rank checks
SEQ_KEY = "frnccl/incident_seq"
STATUS_SEQ_KEY = "frnccl/status/seq"  # status.py's SEQ_KEY, MonitorCoordination.cpp's kStatusSeqKey
INCIDENT = "20260101-000000.000-manual-bench"
ABSENT = b"frnccl: no such key \x01"  # StoreValues.cpp readIfPresent: a compareSet that reads without setting
WAKE_BATCH = 1024
PER_SOURCE = 20_000  # simulated ranks per loopback source address (127.0.0.1, .2, ...)
MISSING_EVERY = 100  # one rank in this many does not write (its dump failed): the trigger must name it


def _key(k: str) -> bytes:
    b = ("/" + k).encode()  # TCPStore's clients put "/" before every key (its keyPrefix_)
    return struct.pack("<Q", len(b)) + b


def req(kind: int, *keys: str, value: bytes | None = None, count: bool = False, i64: int | None = None) -> bytes:
    out = bytes([kind])
    if count:
        out += struct.pack("<Q", len(keys))
    for k in keys:
        out += _key(k)
    if value is not None:
        out += struct.pack("<Q", len(value)) + value
    if i64 is not None:
        out += struct.pack("<q", i64)
    return out


# ---------------------------------------------------------------- the server

SERVER = """
import sys, time
from datetime import timedelta
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60), wait_for_workers=False, use_libuv=True)
print(s.port, flush=True)
sys.stdin.read()
"""


def server_cmd() -> list[str]:
    """The server's command line. torch's server looks up each client's address in DNS as it accepts it
    (formatSockAddr's getnameinfo), and on this machine a lookup now and then waits out the resolver's 5 s
    timeout, holding the server's loop: thousands of connections cost minutes, and thousands of queries to
    the machine's resolver. Where it can (root, unshare), the server runs with a resolver on loopback,
    which refuses at once; torch then stops looking names up for the rest of the run."""
    cmd = [sys.executable, "-c", SERVER]
    conf = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"bench-store-resolv-{os.getpid()}.conf")
    with open(conf, "w") as f:
        f.write("nameserver 127.0.0.1\n")
    atexit.register(lambda: os.path.exists(conf) and os.unlink(conf))  # the servers are gone by then
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind {conf} /etc/resolv.conf"],
                           capture_output=True, check=False) if os.geteuid() == 0 else None
    if probe is None or probe.returncode != 0:
        print("# cannot give the server a loopback resolver (needs root and unshare): its DNS lookups of "
              "clients may stall it", file=sys.stderr)
        return cmd
    return ["unshare", "-m", "sh", "-c", f'mount --bind {conf} /etc/resolv.conf && exec "$0" "$@"', *cmd]


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- the simulated ranks (a child process)


@dataclass
class Conn:
    rank: int
    sock: socket.socket
    pending: list = field(default_factory=list)  # reply kinds expected, in order
    buf: bytearray = field(default_factory=bytearray)
    out: bytearray = field(default_factory=bytearray)
    seen: float = 0.0  # time.monotonic() when it saw the request
    wrote: bool = False
    verdict: float = 0.0  # time.monotonic() when it read the verdict


# Linux's IP_BIND_ADDRESS_NO_PORT (not in every Python's socket module).
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)


def _connect(port: int, source: str) -> socket.socket:
    """A connection to the server from ``source``, one source address per PER_SOURCE ranks: a (source, server)
    pair has ~28,000 ephemeral ports. The port is picked at connect(), for this server's port alone: picked at
    bind() it must be free of every connection, and an earlier size's thousands in TIME_WAIT exhaust them."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        s.bind((source, 0))
        s.connect(("127.0.0.1", port))
    except OSError:
        s.close()
        raise
    return s


class Ranks:
    def __init__(self, port: int, ranks: range, world: int, pattern: str) -> None:
        self.pattern = pattern
        self.world = world
        self.sel = selectors.DefaultSelector()
        self.conns: list[Conn] = []
        self.requests = 0
        self.answer_bytes = 0  # status: the answers' bytes the ranks set
        self.last_answer = 0.0  # status: time.monotonic() of the last answer sent (one clock for the machine)
        for r in ranks:
            s = _connect(port, f"127.0.0.{1 + r // PER_SOURCE}")
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
            c = Conn(r, s)
            self.conns.append(c)
            self.sel.register(s, selectors.EVENT_READ, c)
            self.send(c, req(VALIDATE) + struct.pack("<I", MAGIC), None)
            if pattern in ("push", "status"):
                self.send(c, req(DELETE_KEY, f"frnccl/wake/{r}"), DELETE_KEY)
                self.send(c, req(WAIT, f"frnccl/wake/{r}", count=True), WAIT)
            if (r - ranks.start) % 256 == 0:
                self.pump(0)
        self.pump(0)

    def send(self, c: Conn, data: bytes, reply: int | None) -> None:
        if data[0] != VALIDATE:
            self.requests += 1
        if reply is not None:
            c.pending.append(reply)
        c.out += data
        self.flush(c)

    def flush(self, c: Conn) -> None:
        while c.out:
            try:
                sent = c.sock.send(c.out)
            except BlockingIOError:
                self.sel.modify(c.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, c)
                return
            del c.out[:sent]
        self.sel.modify(c.sock, selectors.EVENT_READ, c)

    def replies(self, c: Conn) -> list[tuple[int, bytes]]:
        got = []
        while c.pending:
            kind = c.pending[0]
            size = REPLY[kind]
            if size < 0:
                if len(c.buf) < 8:
                    break
                size = 8 + struct.unpack_from("<Q", c.buf)[0]
            if len(c.buf) < size:
                break
            got.append((kind, bytes(c.buf[:size])))
            del c.buf[:size]
            c.pending.pop(0)
        return got

    def pump(self, timeout: float) -> None:
        for key, ev in self.sel.select(timeout):
            c: Conn = key.data
            if ev & selectors.EVENT_WRITE:
                self.flush(c)
            if ev & selectors.EVENT_READ:
                data = c.sock.recv(1 << 16)
                if not data:
                    raise SystemExit(f"rank {c.rank}: the server closed the connection")
                c.buf += data
                for kind, body in self.replies(c):
                    self.on_reply(c, kind, body)

    def on_reply(self, c: Conn, kind: int, body: bytes) -> None:
        now = time.monotonic()
        if self.pattern == "status":
            self.on_status_reply(c, kind, body)
            return
        if self.pattern == "poll" and kind == CHECK and body[0] == 0 and not c.seen:  # READY
            c.seen = now
            if c.rank % MISSING_EVERY != MISSING_EVERY - 1:
                self.send(c, req(SET, f"frnccl/wrote/{INCIDENT}/{c.rank}", value=b"1"), None)
                c.wrote = True
        if self.pattern == "push" and kind == WAIT and not c.seen:
            c.seen = now
            self.follow_up(c)
        elif self.pattern == "push" and kind == WAIT and c.wrote and not c.verdict:
            # Woken again: the verdict is posted (fetchVerdict: one readIfPresent).
            c.verdict = now
            self.send(c, req(DELETE_KEY, f"frnccl/wake/{c.rank}"), DELETE_KEY)
            key = f"frnccl/verdict/{INCIDENT}"
            self.send(c, req(COMPARE_SET, key, value=ABSENT) + struct.pack("<Q", len(ABSENT)) + ABSENT, GET)
            self.send(c, req(WAIT, f"frnccl/wake/{c.rank}", count=True), WAIT)

    def follow_up(self, c: Conn) -> None:
        """What a woken rank's monitor asks the store: read the request, report its part, wait again."""
        r = c.rank
        self.send(c, req(DELETE_KEY, f"frnccl/wake/{r}"), DELETE_KEY)
        for key in (SEQ_KEY, "frnccl/incident/1"):  # the request number, then the request (readIfPresent)
            self.send(c, req(COMPARE_SET, key, value=ABSENT) + struct.pack("<Q", len(ABSENT)) + ABSENT, GET)
        if r % MISSING_EVERY != MISSING_EVERY - 1:
            self.send(c, req(SET, f"frnccl/summary/{INCIDENT}/{r}", value=summary(r, self.world)), None)
            self.send(c, req(APPEND, f"frnccl/writers/{INCIDENT}", value=f"{r},".encode()), None)
            self.send(c, req(ADD, f"frnccl/written/{INCIDENT}", i64=1), ADD)
            c.wrote = True
        self.send(c, req(WAIT, f"frnccl/wake/{r}", count=True), WAIT)

    def on_status_reply(self, c: Conn, kind: int, body: bytes) -> None:
        """A rank's monitor woken by `frnccl status` (answerStatus): the request's number, then its answer."""
        r = c.rank
        if kind == WAIT:
            self.send(c, req(DELETE_KEY, f"frnccl/wake/{r}"), DELETE_KEY)
            self.send(c, req(COMPARE_SET, SEQ_KEY, value=ABSENT) + struct.pack("<Q", len(ABSENT)) + ABSENT, GET)
            self.send(c, req(CHECK, STATUS_SEQ_KEY, count=True), CHECK)
            self.send(c, req(COMPARE_SET, STATUS_SEQ_KEY, value=ABSENT) + struct.pack("<Q", len(ABSENT)) + ABSENT,
                      STATUS_N)
        elif kind == STATUS_N:
            n = int(body[8:])
            answer = b'{"n":' + str(n).encode() + b',"summary":' + summary(r, self.world, live=True) + b"}"
            self.send(c, req(SET, f"frnccl/status/rank/{r}", value=answer), None)
            self.answer_bytes += len(answer)
            self.last_answer = time.monotonic()
            self.send(c, req(WAIT, f"frnccl/wake/{r}", count=True), WAIT)

    def run(self, cmd_fd: int) -> None:
        """Polls (pattern poll) until told to stop on stdin; answers `seen` with when each rank saw it."""
        n = len(self.conns)
        phase = sorted(range(n), key=lambda r: random.random())
        nxt = 0
        period_start = time.monotonic()
        cmd = os.fdopen(cmd_fd)
        sel_cmd = selectors.DefaultSelector()
        sel_cmd.register(cmd, selectors.EVENT_READ)
        print("READY", flush=True)
        while True:
            if sel_cmd.select(0):
                line = cmd.readline().strip()
                if line == "seen":
                    seen = [c.seen for c in self.conns]
                    wrote = sum(c.wrote for c in self.conns)
                    pending = sum(len(c.pending) for c in self.conns if self.pattern == "poll")
                    print(json.dumps({"last_seen": max(seen) if all(seen) else None,
                                      "not_seen": sum(1 for s in seen if not s), "wrote": wrote,
                                      "requests": self.requests, "pending": pending}), flush=True)
                    continue
                if line == "requests":
                    print(json.dumps({"requests": self.requests, "answer_bytes": self.answer_bytes,
                                      "last_answer": self.last_answer}), flush=True)
                    continue
                if line == "verdict":
                    got = [c.verdict for c in self.conns if c.wrote]
                    print(json.dumps({"last": max(got) if got and all(got) else None, "writers": len(got),
                                      "not_yet": sum(1 for g in got if not g), "requests": self.requests}), flush=True)
                    continue
                return
            if self.pattern == "poll":
                # Each rank's check once a second, spread over the second (random phases).
                due = int(n * min(1.0, (time.monotonic() - period_start)))
                while nxt < due:
                    c = self.conns[phase[nxt]]
                    if not c.seen and len(c.pending) < 2:
                        self.send(c, req(CHECK, DUMP_KEY, count=True), CHECK)
                    nxt += 1
                if time.monotonic() - period_start >= 1.0:
                    period_start += 1.0
                    nxt = 0
            self.pump(0.005)


CULPRIT = 7  # the rank that never issued the op the others wait in


def summary(rank: int, n: int, live: bool = False) -> bytes:
    """A rank's summary as RankSummary.cpp writes it, of a job with a world group and two smaller ones; every
    rank but CULPRIT waits in all_reduce seq 5 of the world group. ``live``: as a status answer carries it
    (no incident, state "live")."""
    def grp(name: str, desc: str, size: int, enq: int, in_flight: bool) -> dict:
        g = {"pg": name, "desc": desc, "size": size, "enqueued": {"seq": enq, "op": "all_reduce"},
             "started": {"seq": enq, "op": "all_reduce"}, "completed": {"seq": 4, "op": "all_reduce"},
             "p2p": [0, 0, 0]}
        if in_flight:
            g["in_flight"] = {"op": "all_reduce", "seq": enq, "p2p": False, "peer": -1, "state": "started",
                              "failed": False, "in": "[[4096,1024]]", "out": "[[4096,1024]]", "dtypes": "BFloat16;BFloat16",
                              "created_ns": 1767225600000000000 + rank,
                              "frame": "/workspace/train/model/parallel/step.py:412 in reduce_gradients"}
        return g
    waits = rank != CULPRIT
    groups = [grp("0", "default_pg", n, 5 if waits else 4, waits),
              grp("1", "tensor_parallel", 8, 4, False), grp("2", "data_parallel", max(1, n // 8), 4, False)]
    frame = "/workspace/train/model/parallel/step.py:412 in reduce_gradients" if waits else "/workspace/train/data.py:88 in next_batch"
    return json.dumps({"v": 1, "rank": rank, "world_size": n, "host": f"node-{rank // 8:05d}.cluster.example.com",
                       "pid": 100000 + rank, "life": 0, "incident": "" if live else INCIDENT,
                       "state": "live" if live else "wrote", "frame": frame,
                       "last_op": {"pg": "0", "op": "all_reduce", "seq": 5 if waits else 4}, "groups": groups,
                       "groups_left_out": 0}, separators=(",", ":")).encode()


def _raise_open_files(want: int) -> None:
    """The open-file limit up to ``want`` for this process and the server and ranks it starts, where allowed
    (root may raise the hard limit up to fs.nr_open); else the limit stays, and sizes past it are reported so."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard >= want:
        return
    try:
        with open("/proc/sys/fs/nr_open") as f:
            cap = int(f.read())
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, cap), min(want, cap)))
    except (OSError, ValueError) as exc:
        print(f"# cannot raise the open-file limit from {hard} to {want} ({exc}; raising it takes CAP_SYS_RESOURCE): "
              "the store server is one process, so it holds at most that many ranks' connections", file=sys.stderr)


def ranks_main(port: int, lo: int, hi: int, world: int, pattern: str) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    Ranks(port, range(lo, hi), world, pattern).run(sys.stdin.fileno())


class RankProcs:
    """The simulated ranks, split into contiguous slices, one process each (``--rank-procs``): one process
    reading 16,384 sockets in turn is itself most of the time to a full answer, where real ranks answer in
    parallel. Each question goes to every process and their answers are combined; the times they report are
    time.monotonic(), one clock for the whole machine."""

    def __init__(self, port: int, n: int, pattern: str, procs: int) -> None:
        procs = max(1, min(procs, n))
        bounds = [n * i // procs for i in range(procs + 1)]
        self.procs = [subprocess.Popen([sys.executable, __file__, "--ranks", str(port), str(lo), str(hi), str(n), pattern],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                      for lo, hi in zip(bounds, bounds[1:])]

    def started(self) -> str | None:
        """None once every process is READY, else what went wrong."""
        for p in self.procs:
            line = p.stdout.readline().strip()
            if line != "READY":
                return f"the simulated ranks did not start ({line or p.wait()})"
        return None

    def ask(self, what: str) -> dict:
        for p in self.procs:
            p.stdin.write(what + "\n")
            p.stdin.flush()
        got = [json.loads(p.stdout.readline()) for p in self.procs]
        total = lambda k: sum(g[k] for g in got)  # noqa: E731
        if what == "requests":
            return {"requests": total("requests"), "answer_bytes": total("answer_bytes"),
                    "last_answer": max(g["last_answer"] for g in got)}
        if what == "seen":
            last = [g["last_seen"] for g in got]
            return {"last_seen": None if None in last else max(last), "not_seen": total("not_seen"),
                    "wrote": total("wrote"), "requests": total("requests"), "pending": total("pending")}
        # "verdict": a process none of whose ranks wrote has no one to wait for.
        last = [g["last"] for g in got if g["writers"]]
        return {"last": None if not last or None in last else max(last), "not_yet": total("not_yet"),
                "requests": total("requests")}

    def stop(self) -> None:
        for p in self.procs:
            try:
                p.stdin.write("stop\n")
                p.stdin.flush()
            except OSError:
                pass
        for p in self.procs:
            p.wait(timeout=30)


# ---------------------------------------------------------------- the bench (the trigger's side)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def the_verdict(client, n: int, missing: list[int], server_pid: int, ask) -> dict:
    """The trigger's verdict once the writers are counted: read the summaries, compute, post, wake, and wait
    until every writer read it."""
    from fr_backend._native import native

    r0 = ask("requests")["requests"]
    c0 = cpu_s(server_pid)
    t0 = time.monotonic()
    gone = set(missing)
    summaries: list[str | None] = [None] * n
    keys, owners = [], []
    read_bytes = 0

    def flush() -> None:
        nonlocal read_bytes
        if keys:
            if not client.check(keys):  # as the trigger: a batch not there whole is read key by key
                raise SystemExit(f"summaries missing in the batch from rank {owners[0]}")
            for r, v in zip(owners, client.multi_get(keys)):
                summaries[r] = v.decode(errors="replace")
                read_bytes += len(v)
            keys.clear()
            owners.clear()

    for r in range(n):
        if r in gone:
            continue
        keys.append(f"frnccl/summary/{INCIDENT}/{r}")
        owners.append(r)
        if len(keys) == WAKE_BATCH:
            flush()
    flush()
    t_read = time.monotonic()
    decided, kind, culprits, lines = native()._compute_verdict(n, summaries, INCIDENT, f"/dumps/{INCIDENT}")
    t_computed = time.monotonic()
    client.set(f"frnccl/verdict/{INCIDENT}", lines[0])
    for start in range(0, n, WAKE_BATCH):
        ks = [f"frnccl/wake/{r}" for r in range(start, min(n, start + WAKE_BATCH))]
        client.multi_set(ks, ["1"] * len(ks))
    t_posted = time.monotonic()
    deadline = t_posted + 30
    while True:
        st = ask("verdict")
        if st["last"] is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return {
        "verdict_s": round(t_posted - t0, 3), "verdict_read_s": round(t_read - t0, 3),
        "verdict_compute_s": round(t_computed - t_read, 3),
        "verdict_all_read_s": round(st["last"] - t0, 3) if st["last"] else f"{st['not_yet']} never read it",
        "verdict_server_cpu_s": round(cpu_s(server_pid) - c0, 2),
        "verdict_rank_requests": st["requests"] - r0, "summary_bytes_read": read_bytes,
        "verdict_line": lines[0][:160], "verdict_decided": decided,
    }


class CountingStore:
    """The status client's store, counting its calls (each one request to the server) and the bytes it reads."""

    def __init__(self, store) -> None:
        self.store = store
        self.calls: dict[str, int] = {}
        self.read_bytes = 0

    def __getattr__(self, name: str):
        fn = getattr(self.store, name)

        def call(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            out = fn(*args)
            if name == "multi_get":
                self.read_bytes += sum(len(v) for v in out)
            return out

        return call


def the_status(port: int, n: int, server_pid: int, ask, asks: int) -> dict:
    """`frnccl status` against the simulated job: ``asks`` requests through fr_backend.status.ask (the CLI's
    own function, timed in this process), then the CLI itself once, as a user runs it."""
    from fr_backend import status

    opened = status.open_job
    runs = []
    try:
        for _ in range(asks):
            counted: list[CountingStore] = []

            def open_counted(endpoint: str, world_size: int):
                store, world = opened(endpoint, world_size)
                counted.append(CountingStore(store))
                return counted[-1], world

            status.open_job = open_counted
            r0 = ask("requests")
            c0 = cpu_s(server_pid)
            t0 = time.monotonic()
            st = status.ask(f"127.0.0.1:{port}", 0, 10.0)
            t1 = time.monotonic()
            cpu = cpu_s(server_pid) - c0
            r1 = ask("requests")  # every answer the client read was sent, and counted, before it reached the store
            client = counted[-1]
            runs.append({"seconds": st.seconds, "answered": len(st.answered), "server_cpu_s": cpu,
                         # The simulated ranks' share: until the one process driving them sent its last answer.
                         "ranks_done_s": r1["last_answer"] - t0, "client_after_s": t1 - r1["last_answer"],
                         "rank_requests": r1["requests"] - r0["requests"],
                         "rank_bytes": r1["answer_bytes"] - r0["answer_bytes"],
                         "client_requests": sum(client.calls.values()), "client_calls": dict(client.calls),
                         "client_read_bytes": client.read_bytes})
            time.sleep(1.0)  # polled once a second, as a user's watch loop
    finally:
        status.open_job = opened
    s = time.monotonic()
    cli = subprocess.run([sys.executable, "-m", "fr_backend.cli", "status", "--store", f"127.0.0.1:{port}", "--json"],
                         capture_output=True, text=True, timeout=120)
    cli_wall = time.monotonic() - s
    try:
        got = json.loads(cli.stdout)
        cli_row = {"cli_rc": cli.returncode, "cli_seconds": got["seconds"], "cli_answered": len(got["answered"]),
                   "cli_wall_s": round(cli_wall, 2), "cli_json_bytes": len(cli.stdout)}
    except (ValueError, KeyError):
        cli_row = {"cli_rc": cli.returncode, "cli_error": (cli.stderr or cli.stdout)[-300:]}
    med = lambda k: statistics.median(r[k] for r in runs)  # noqa: E731
    return {"status_s_median": round(med("seconds"), 3), "status_s_max": round(max(r["seconds"] for r in runs), 3),
            "status_ranks_done_s": round(med("ranks_done_s"), 3), "status_client_after_s": round(med("client_after_s"), 3),
            "status_answered_min": min(r["answered"] for r in runs), "status_asks": len(runs),
            "status_server_cpu_s": round(med("server_cpu_s"), 3), "status_rank_requests": int(med("rank_requests")),
            "status_rank_bytes": int(med("rank_bytes")), "status_client_requests": int(med("client_requests")),
            "status_client_calls": runs[-1]["client_calls"], "status_client_read_bytes": int(med("client_read_bytes")),
            **cli_row}


def one(n: int, pattern: str, idle_s: float, asks: int = 5, rank_procs: int = 1) -> dict:
    from torch.distributed import TCPStore

    server = subprocess.Popen(server_cmd(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ranks = None
    try:
        port = int(server.stdout.readline())
        client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60), wait_for_workers=False)
        client.set("frnccl/world_size", str(n))
        t_connect = time.monotonic()
        ranks = RankProcs(port, n, pattern, rank_procs)
        failed = ranks.started()
        if failed:
            return {"n": n, "pattern": pattern, "error": failed}
        # torch's server answers slowly for a while after a burst of connections (here: seconds at a time,
        # at a few % CPU): the figures below are of the job once it answers promptly again.
        fast = 0
        while fast < 20 and time.monotonic() - t_connect < 600:
            s = time.perf_counter()
            client.add("rdzv/unrelated", 1)
            fast = fast + 1 if time.perf_counter() - s < 0.02 else 0
            time.sleep(0.05)
        connect_s = time.monotonic() - t_connect

        ask = ranks.ask

        time.sleep(1.0)  # every rank in its steady state: waiting (push) or checking once a second (poll)
        r0 = ask("requests")["requests"]
        c0, t0 = cpu_s(server.pid), time.monotonic()
        time.sleep(idle_s)
        c1, t1 = cpu_s(server.pid), time.monotonic()
        r1 = ask("requests")["requests"]
        idle_cpu = 100 * (c1 - c0) / (t1 - t0)
        idle_rate = (r1 - r0) / (t1 - t0)
        lat = []
        for _ in range(300):
            s = time.perf_counter()
            client.add("rdzv/unrelated", 1)
            lat.append((time.perf_counter() - s) * 1e6)
            time.sleep(0.005)
        base = {"n": n, "pattern": pattern, "rank_procs": len(ranks.procs), "settle_s": round(connect_s, 1),
                "idle_cpu_pct": round(idle_cpu, 2), "idle_requests_per_s": round(idle_rate, 1),
                "unrelated_p50_us": round(pct(lat, 0.5)), "unrelated_p99_us": round(pct(lat, 0.99))}
        if pattern == "status":
            return {**base, **the_status(port, n, server.pid, ask, asks)}
        # The request.
        c_ask = cpu_s(server.pid)
        t_ask = time.monotonic()
        if pattern == "poll":
            client.set(DUMP_KEY, "0")
        else:
            client.compare_set("frnccl/active", "", f"{INCIDENT}|{time.time_ns()}")
            seq = client.add(SEQ_KEY, 1)
            client.set(f"frnccl/incident/{seq}", f"{INCIDENT}\nmanual\n-1\nbench")
            for start in range(0, n, WAKE_BATCH):
                ks = [f"frnccl/wake/{r}" for r in range(start, min(n, start + WAKE_BATCH))]
                client.multi_set(ks, ["1"] * len(ks))
        deadline = time.monotonic() + 30
        while True:
            st = ask("seen")
            if st["last_seen"] is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        reach_s = (st["last_seen"] - t_ask) if st["last_seen"] else None
        writers = n - n // MISSING_EVERY
        if pattern == "poll":
            time.sleep(1.0)  # the writers' `set`s (no answer) are in
        else:
            while int(client.add(f"frnccl/written/{INCIDENT}", 0)) < writers and time.monotonic() < deadline:
                time.sleep(0.05)
        burst_cpu = cpu_s(server.pid) - c_ask
        # Count the writers and name the missing ranks, as the trigger does.
        s = time.perf_counter()
        if pattern == "poll":
            missing, left = [], []
            for r in range(n):
                if client.check([f"frnccl/wrote/{INCIDENT}/{r}"]):
                    continue
                (left if client.check([f"frnccl/left/{r}"]) else missing).append(r)
            count_calls = n + len(missing) + len(left)
        else:
            absent = "frnccl: no such key \x01"
            writers = client.compare_set(f"frnccl/writers/{INCIDENT}", absent, absent).decode()
            gone = client.compare_set("frnccl/left_ranks", absent, absent).decode()
            wrote = {int(x) for x in writers.split(",") if x.isdigit()} if writers != absent else set()
            missing = [r for r in range(n) if r not in wrote]
            count_calls = 2
            del gone
        name_s = time.perf_counter() - s
        verdict = the_verdict(client, n, missing, server.pid, ask) if pattern == "push" else {}
        expect_missing = n // MISSING_EVERY
        return {
            **base, "all_saw_s": round(reach_s, 3) if reach_s is not None else f"{st['not_seen']} never saw it",
            "request_server_cpu_s": round(burst_cpu, 2),
            "name_missing_s": round(name_s, 4), "name_missing_calls": count_calls,
            "missing_named": len(missing), "missing_expected": expect_missing, **verdict,
        }
    finally:
        if ranks is not None:
            ranks.stop()
        server.stdin.close()
        server.wait(timeout=30)


def table_head(*heads: str) -> None:
    print("| " + " | ".join(heads) + " |")
    print("|" + " --- |" * len(heads))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--ranks":
        ranks_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1024,4096,16384", help="comma list of simulated rank counts")
    p.add_argument("--patterns", default="poll,push", help="comma list of: poll, push, status")
    p.add_argument("--status-asks", type=int, default=5, help="status: requests per size, one a second (median)")
    p.add_argument("--idle-s", type=float, default=10.0, help="seconds of idle over which the server's CPU is read")
    p.add_argument("--rank-procs", type=int, default=1,
                   help="processes that drive the simulated ranks, each a contiguous slice (default 1); on a machine "
                        "with cores to spare, more of them answer as real ranks do, in parallel")
    p.add_argument("--json", action="store_true", help="print one JSON line per case instead of a table")
    args = p.parse_args()
    _raise_open_files(max(int(x) for x in args.sizes.split(",")) + 64)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(f"# open files per process: {hard}; cores: {os.cpu_count()}; idle window {args.idle_s} s", file=sys.stderr)
    rows = []
    for n in [int(x) for x in args.sizes.split(",")]:
        for pattern in args.patterns.split(","):
            if n + 64 > hard:
                rows.append({"n": n, "pattern": pattern, "error": f"needs {n} sockets per process, the limit is {hard}"})
                continue
            row = one(n, pattern, args.idle_s, args.status_asks, args.rank_procs)
            rows.append(row)
            print(json.dumps(row) if args.json else row, file=sys.stderr if not args.json else sys.stdout, flush=True)
    if not args.json and any("status_s_median" not in r for r in rows):
        print("| ranks | pattern | server CPU idle | idle requests/s | unrelated call p50 / p99 | all ranks saw the request | "
              "server CPU for the request and the writers' replies | name the missing ranks |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            if "status_s_median" in r:
                continue
            if "error" in r:
                print(f"| {r['n']:,} | {r['pattern']} | {r['error']} | | | | | |")
                continue
            saw = f"{r['all_saw_s']} s" if isinstance(r["all_saw_s"], float) else r["all_saw_s"]
            print(f"| {r['n']:,} | {r['pattern']} | {r['idle_cpu_pct']}% of a core | {r['idle_requests_per_s']:,} | "
                  f"{r['unrelated_p50_us']} / {r['unrelated_p99_us']} µs | {saw} | {r['request_server_cpu_s']} s | "
                  f"{r['name_missing_s'] * 1000:.1f} ms ({r['name_missing_calls']:,} calls, "
                  f"{r['missing_named']}/{r['missing_expected']} named) |")
    if not args.json:
        statuses = [r for r in rows if "status_s_median" in r]
        if statuses:
            print()
            table_head("ranks", "full answer, median / max", "of which the simulated ranks / the client after the last answer",
                       "ranks answered (min)", "server CPU per ask", "rank requests", "bytes the ranks set",
                       "client requests", "bytes the client read", "the CLI (answer / wall)")
            for r in statuses:
                cli = (f"{r['cli_seconds']} s / {r['cli_wall_s']} s ({r['cli_answered']:,} answered)"
                       if "cli_seconds" in r else f"rc {r['cli_rc']}: {r.get('cli_error', '')[:60]}")
                print(f"| {r['n']:,} | {r['status_s_median']} / {r['status_s_max']} s ({r['status_asks']} asks) | "
                      f"{r['status_ranks_done_s']} s / {r['status_client_after_s']} s | "
                      f"{r['status_answered_min']:,}/{r['n']:,} | {r['status_server_cpu_s']} s | "
                      f"{r['status_rank_requests']:,} | {r['status_rank_bytes']:,} | {r['status_client_requests']:,} | "
                      f"{r['status_client_read_bytes']:,} | {cli} |")
        verdicts = [r for r in rows if "verdict_s" in r]
        if verdicts:
            print()
            table_head("ranks", "verdict posted (summaries read + computed)", "every rank read it", "server CPU",
                       "rank requests", "summary bytes read", "verdict")
            for r in verdicts:
                every = f"{r['verdict_all_read_s']} s" if isinstance(r["verdict_all_read_s"], float) else r["verdict_all_read_s"]
                print(f"| {r['n']:,} | {r['verdict_s']} s ({r['verdict_read_s']} + {r['verdict_compute_s']}) | {every} | "
                      f"{r['verdict_server_cpu_s']} s | {r['verdict_rank_requests']:,} | {r['summary_bytes_read']:,} | "
                      f"{'decided' if r['verdict_decided'] else 'undecided'}: {r['verdict_line'][:70]}... |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
