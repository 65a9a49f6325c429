"""Reading dump files in worker processes that the kernel stops when one file takes too much CPU.

Why: a pickle can make the C unpickler work for hours before any Python check runs. A dict key (or set
member) that is a tuple of shared tuples nested in one another is hashed when the dict is built, and
hashing a tuple hashes its members again, each time: ~250 bytes at depth 40 cost 2**40 hash steps. The
unpickler never returns to the interpreter's loop meanwhile, so no signal handler, timer or check can stop
it from inside. The command line therefore reads each file in a worker process whose CPU-time limit
(RLIMIT_CPU) is lowered, before each file, to what the worker has used plus the file's allowance
(``cpu_allowance``): the kernel ends a worker that runs past it (SIGXCPU), the parent names that file as
refused, starts a new worker and goes on with the others. A worker killed for any other reason (out of
memory, a signal from outside) likewise costs only the file it was reading.

A pickle is first read without measuring its entries' unfolded size (bounds.check, a quarter of a torch dump's
read and reduction) under a smaller CPU allowance, with the address space bounded over the read and the
reduction, and its summary measured instead (``_read_bounded``). A pickle that this first read refuses, or
that runs past its CPU allowance, is read again, measured, with the whole allowance: what it says then is the
file's outcome, so a memo bomb the reduction follows is refused by name, after a second or two of CPU, and a
pickle that reads costs one read.

ProcessPoolExecutor cannot do this: a worker that dies breaks the whole pool, and its results do not say
which file a dead worker was reading. Here each worker has a pipe of its own; it reads the files sent to it
in order and answers in order, so the file it was reading is always its oldest unanswered one.

Ownership: the parent owns every worker and its end of the worker's pipe; it kills (SIGKILL) and reaps each
worker when done with it, also when its loop ends early (an exception, Ctrl-C, a caller that stopped
iterating). A worker holds only its own end of its own pipe, and exits when that end reads EOF.
"""

from __future__ import annotations

import gc
import math
import os
import pickle
import signal
import stat
import struct
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from . import bounds
from .dumpfile import UNPICKLE_FLOOR, UNPICKLE_PER_BYTE, address_space, guard_address_space, measure_tree
from .model import DumpError, LoadProblem, RankSummary

if TYPE_CHECKING:  # imported where workers are started: 3 ms that a library read in this process need not pay
    from multiprocessing.connection import Connection

__all__ = ["FILE_CPU_BASE_S", "FILE_CPU_PER_MIB_S", "available", "cpu_allowance", "file_size", "read_isolated"]

# CPU seconds a file may take to be read and reduced: a base plus an allowance per MiB of file, so that a
# hostile file gets no more than an honest file of its size could need. Measured (Python 3.11, 2 vCPUs,
# load + reduce): 20,000 entries take 0.26 s (5 MiB pickle, 14 MiB JSON), 20,000 entries with 40 distinct
# frames each 0.65 s (90 MiB pickle) and 1.5 s (104 MiB JSON), 200,000 entries 1.3 s (52 MiB pickle) and
# 2.0 s (144 MiB JSON): at most 0.05 s per MiB. The bound is 10-20 times that (a 4 GiB file may take
# 17 minutes), and a bomb of a few hundred bytes is refused after 5 s.
FILE_CPU_BASE_S = 5
FILE_CPU_PER_MIB_S = 0.25
# The first read of a pickle skips bounds.check on its entries (a quarter of a torch dump's read): its base is
# still 4 times what a 20,000-entry dump needs. A pickle that fails it, or runs past it, is read again with the
# check and the whole allowance, so a bomb is refused by name after a second or two of CPU.
FIRST_READ_CPU_BASE_S = 1

ReadPath = Callable[[str, int | None], tuple[RankSummary | None, LoadProblem | None]]
Outcome = tuple[RankSummary | None, list[LoadProblem]]


class Cand(Protocol):
    rank_hint: int | None
    paths: list[str]


def available() -> bool:
    """Whether workers can be forked here (they inherit the loaded analyzer: nothing is imported again)."""
    return hasattr(os, "fork")


# Address space that a pickle's first read and reduction may take in a worker beyond what it holds: twice what
# unpickling alone may (dumpfile.UNPICKLE_*), since the raw tree stays while the reduction builds the summary.
FIRST_READ_FLOOR = 2 * UNPICKLE_FLOOR
FIRST_READ_PER_BYTE = 2 * UNPICKLE_PER_BYTE


def file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _pickle_size(path: str) -> int | None:
    """The size of a regular file that starts as a pickle does (dumpfile.parse_dump's test), else None: only a
    pickle's raw tree can share references. Opened without blocking: a FIFO must not stall the worker."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        head = os.read(fd, 1) if stat.S_ISREG(st.st_mode) else b""
    except OSError:
        return None
    finally:
        os.close(fd)
    return st.st_size if head == b"\x80" or head in (b"(", b"}", b"]") else None


def cpu_allowance(size: int, first: bool = False) -> int:
    """Whole CPU seconds that reading a file of ``size`` bytes may take (RLIMIT_CPU counts whole seconds); with
    ``first``, on its first read, which does not measure the raw tree."""
    return (FIRST_READ_CPU_BASE_S if first else FILE_CPU_BASE_S) + int(FILE_CPU_PER_MIB_S * size / (1 << 20))


# --------------------------------------------------------------------------- the worker's side


def _limit_cpu(allowance: int) -> None:
    """RLIMIT_CPU's soft limit at the CPU time used so far plus ``allowance`` seconds (the hard limit is left
    alone, so the next file can raise the soft one again)."""
    import resource

    used = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(used.ru_utime + used.ru_stime) + allowance
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _read_bounded(read_path: ReadPath, path: str, hint: int | None, first: bool) -> tuple[RankSummary | None,
                                                                                         LoadProblem | None]:
    """``read_path`` under the file's CPU allowance. The ``first`` read of a pickle, where the address space can be
    bounded over the whole read and reduction, does not measure the entries' unfolded size (dumpfile.measure_tree:
    the rest of the file still is): a memo bomb there that the reduction follows ends in MemoryError (then the
    file is read again here, measured, for the refusal by name) or in the first read's CPU allowance (then the
    parent has it read again, measured), and one it does not follow goes with the raw tree. Any other file, or
    read, is measured as ever. What leaves the worker, the summary, is measured in ``_answer``."""
    size = _pickle_size(path) if first else None  # stat'ed here, not in the busier parent
    if size is None:
        _limit_cpu(cpu_allowance(file_size(path)))
        return read_path(path, hint)
    _limit_cpu(cpu_allowance(size, first=True))
    with address_space(FIRST_READ_FLOOR + FIRST_READ_PER_BYTE * size) as bounded, measure_tree(not bounded):
        summary, problem = read_path(path, hint)
    if summary is None and bounded:
        return _read_bounded(read_path, path, hint, first=False)
    return summary, problem


def _measure(summary: RankSummary, nbytes: int) -> None:
    """bounds.check of a summary against ``nbytes``, with the rank's one signature table counted once: every group
    refers to it, and the memo-less measure would count it again for each of them (a rank in 100 groups)."""
    table = summary.sigs
    sharing = [rp for rp in summary.pgs.values() if rp.sigs is table]
    for rp in sharing:
        rp.sigs = []
    try:
        bounds.check(summary, nbytes)
    finally:
        for rp in sharing:
            rp.sigs = table


def _answer(task: int, path: str, summary: RankSummary | None, problem: LoadProblem | None) -> bytes:
    """The pickled (task, summary, problem). The parent follows the summary as a tree: it must not unfold far
    past its pickle (its memo writes a shared value once), as bounds.check measures a dump against its file.
    Against its own pickle, not the file: a compact file holds ~1 byte an entry, its summary ~60."""
    try:
        data = pickle.dumps((task, summary, problem), pickle.HIGHEST_PROTOCOL)
        if summary is not None:
            _measure(summary, len(data))
        return data
    except DumpError:
        problem = LoadProblem(path, "refused: what it reduces to unfolds far past its size (shared references "
                                    "nested in one another: a pickle bomb)")
    except Exception as exc:  # noqa: BLE001 - a summary that does not pickle: that file's problem only
        problem = LoadProblem(path, f"could not be analysed (internal error {type(exc).__name__}: {str(exc)[:60]})")
    return pickle.dumps((task, None, problem), pickle.HIGHEST_PROTOCOL)


def _serve(conn: Connection, read_path: ReadPath) -> None:
    """A worker's loop: one (task, path, rank hint, first read?) at a time, read under that path's CPU allowance
    and answered with (task, summary, problem); ends at EOF."""
    gc.disable()  # as in the parent: millions of small containers, no cycles
    guard_address_space()  # a worker does nothing but read: its reads may lower RLIMIT_AS (the whole process's)
    # Ctrl-C reaches the whole process group: the parent handles it and kills the workers
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SIGXCPU must end the worker (its default action), whatever the parent inherited, without a core file
    signal.signal(signal.SIGXCPU, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGXCPU})
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    except (ImportError, OSError, ValueError):
        pass
    fd = conn.fileno()
    while True:
        try:
            task, path, hint, first = conn.recv()
        except (EOFError, OSError):
            return
        summary, problem = _read_bounded(read_path, path, hint, first)
        data = _answer(task, path, summary, problem)
        try:
            _send_frame(fd, data)
        except OSError:
            return


# Messages both ways are framed as multiprocessing.Connection frames them (a big-endian length, -1 and a
# 64-bit length past 2 GiB), so that the worker reads its tasks with Connection.recv. A summary (~90 KB at
# 2,000 entries) goes in one write, header included: written in two (as Connection.send does past 16 KiB),
# the header alone wakes the parent, which then blocks in read until the worker is scheduled again, two
# context switches more per file on a busy machine. The parent reads each summary into one reused buffer
# (Connection.recv reads it in chunks into a BytesIO and copies it out again).
_HEAD = struct.Struct("!i")
_HEAD64 = struct.Struct("!q")


def _frame(data: bytes) -> bytes:
    n = len(data)
    if n > 0x7FFFFFFF:
        return _HEAD.pack(-1) + _HEAD64.pack(n) + data
    return _HEAD.pack(n) + data


def _send_frame(fd: int, data: bytes) -> None:
    """Writes ``data`` framed, whole (a blocking fd: a write returns once some of it is taken)."""
    view = memoryview(_frame(data))
    while view:
        view = view[os.write(fd, view):]


def _read_into(fd: int, view: memoryview) -> None:
    """Fills ``view`` from ``fd``; EOFError when the other end closed first."""
    got, n = 0, len(view)
    while got < n:
        k = os.readv(fd, [view[got:]])
        if not k:
            raise EOFError
        got += k


_BUF_START = 1 << 17
_BUF_KEPT = 16 << 20


class _Reader:
    """The parent's side: each worker's answer read into one buffer, grown to the largest answer seen (one past
    16 MiB is let go once read)."""

    def __init__(self) -> None:
        self.buf = bytearray(_BUF_START)
        self.head = bytearray(8)

    def recv(self, fd: int) -> object:
        head = memoryview(self.head)
        _read_into(fd, head[:4])
        (n,) = _HEAD.unpack_from(head)
        if n == -1:
            _read_into(fd, head)
            (n,) = _HEAD64.unpack_from(head)
        if n > len(self.buf):
            self.buf = bytearray(n)
        with memoryview(self.buf) as view:
            body = view[:n]
            _read_into(fd, body)
            try:
                return pickle.loads(body)  # copies what it keeps: the buffer is free for the next message
            finally:
                body.release()
                if n > _BUF_KEPT:  # one huge answer does not hold its size for the rest of the load
                    self.buf = bytearray(_BUF_START)


# --------------------------------------------------------------------------- the parent's side


# Files sent to a worker ahead: it reads them in order and answers in order, so the one it is reading is
# always the oldest unanswered; the next ones wait in its pipe, and the worker goes on to them without
# waiting for the parent, which on a busy machine may not get a core for tens of ms (ProcessPoolExecutor
# queued about as many). A worker killed from outside in the moment between two files is taken to have died
# on the second; the files behind go back to the queue.
IN_FLIGHT = 4


Task = tuple[int, int, bool]  # (candidate, path index, its first read: the raw tree not measured)


@dataclass
class _Worker:
    pid: int
    conn: Connection  # the parent's end of its pipe
    tasks: deque[Task] = field(default_factory=deque)  # sent and not answered yet, oldest (being read) first
    watched: bool = False  # registered in the parent's selector (while it has tasks)


def _fork(others: list[Connection], read_path: ReadPath) -> _Worker:
    """A worker, forked (os.fork, not multiprocessing: nothing is flushed, imported or run at exit in it; it
    ends with os._exit, so the parent's buffered output is never written twice)."""
    from multiprocessing.connection import Pipe

    mine, theirs = Pipe(duplex=True)
    try:
        pid = os.fork()
    except OSError:
        mine.close()
        theirs.close()
        raise
    if pid == 0:  # the worker
        code = 0
        try:
            mine.close()
            for c in others:  # the parent's ends of the other workers' pipes: held here, they would hide its EOF
                c.close()
            _serve(theirs, read_path)
        except BaseException:  # noqa: BLE001 - the parent names the file it was reading from the exit status
            code = 70
        finally:
            os._exit(code)
    theirs.close()
    return _Worker(pid, mine)


def _reap(w: _Worker, kill: bool) -> int:
    """The worker's exit status as multiprocessing gives it (negative: the signal that ended it), killed first
    when ``kill`` (a worker that has already ended keeps the status it ended with: its exit closed its pipe
    after that status was set)."""
    if kill:
        _kill(w.pid)
    return os.waitstatus_to_exitcode(os.waitpid(w.pid, 0)[1])


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass
class _State:
    """What the parent knows of each candidate: its problems so far and, once settled, its summary."""

    cands: Sequence[Cand]
    problems: list[list[LoadProblem]] = field(default_factory=list)
    settled: dict[int, RankSummary | None] = field(default_factory=dict)

    def outcome(self, i: int, k: int, summary: RankSummary | None, problem: LoadProblem | None,
                todo: deque[Task]) -> None:
        """Path k of candidate i was read: the candidate is settled, or its next path is read first."""
        if problem is not None:
            self.problems[i].append(problem)
        if summary is not None or k + 1 >= len(self.cands[i].paths):
            self.settled[i] = summary
        else:
            todo.appendleft((i, k + 1, True))  # before later candidates: results are handed out in order


def _death(code: int, path: str) -> str:
    """Why a worker ended (its exit status ``code``) while reading ``path``, as a one-line problem."""
    if code == -signal.SIGXCPU:
        allowance = cpu_allowance(file_size(path))  # as the worker computed it (unless the file changed since)
        try:
            size = f"{os.stat(path).st_size} bytes"
        except OSError:
            size = "its size"
        return (f"refused: reading it took more than {allowance} s of CPU, far more than a dump of {size} needs "
                "(a hostile or damaged pickle)")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory, or killed from outside)" if -code == signal.SIGKILL else ""
        return f"refused: the process reading it was killed by {name}{hint}"
    return f"refused: the process reading it ended (exit status {code})"


def read_isolated(cands: Sequence[Cand], jobs: int, read_path: ReadPath) -> Iterator[Outcome]:
    """(summary, problems) of each candidate, in their order, each path read by ``read_path`` in one of
    ``jobs`` forked workers under its CPU allowance. A candidate's paths are tried in order until one
    yields a summary (as load._load_one does in-process)."""
    import selectors

    st = _State(cands, [[] for _ in cands])
    todo: deque[Task] = deque((i, 0, True) for i, c in enumerate(cands) if c.paths)
    st.settled.update((i, None) for i, c in enumerate(cands) if not c.paths)
    workers: list[_Worker] = []
    fork_error = ""
    # the workers with files in flight, registered once each while busy (multiprocessing.connection.wait built
    # a selector of its own at every call: ~0.1 ms a file)
    sel = selectors.DefaultSelector()
    reader = _Reader()

    def start(ahead: int = IN_FLIGHT) -> None:
        nonlocal fork_error
        try:
            w = _fork([x.conn for x in workers], read_path)
        except OSError as exc:  # EAGAIN, ENOMEM: go on with the workers there are
            fork_error = exc.strerror or str(exc)
            return
        workers.append(w)
        feed(w, ahead)

    def feed(w: _Worker, ahead: int = IN_FLIGHT) -> None:
        if todo and not w.watched:  # idle until now: its answers are waited for from here on
            sel.register(w.conn, selectors.EVENT_READ, w)
            w.watched = True
        while todo and len(w.tasks) < ahead:
            task = todo.popleft()
            i, k, first = task
            w.tasks.append(task)
            try:
                _send_frame(w.conn.fileno(), pickle.dumps((i, cands[i].paths[k], cands[i].rank_hint, first),
                                                          pickle.HIGHEST_PROTOCOL))
            except OSError:
                return  # it died: the wait below sees its EOF, and handles what was sent as for any death

    try:
        for _ in range(max(1, min(jobs, len(todo)))):
            start(ahead=1)  # one file each first: 2 files, 2 workers, one each
        for w in workers:
            feed(w)
        nxt = 0
        while True:
            while nxt in st.settled:
                yield st.settled.pop(nxt), st.problems[nxt]
                nxt += 1
            if nxt >= len(cands):
                return
            if not sel.get_map():  # no worker could be started: said for each file left, never read here
                while todo:
                    i, k, _ = todo.popleft()
                    st.outcome(i, k, None, LoadProblem(cands[i].paths[k], "not read: no process could be started "
                                                       f"to read it ({fork_error or 'fork failed'})"), todo)
                continue
            for key, _ in sel.select():
                w = key.data
                i, k, first = w.tasks.popleft()
                try:
                    _, summary, problem = reader.recv(w.conn.fileno())
                except (EOFError, OSError):  # it died mid-file: a new worker goes on
                    sel.unregister(w.conn)
                    w.watched = False
                    w.conn.close()
                    workers.remove(w)
                    todo.extendleft(reversed(w.tasks))  # sent, never started
                    path = cands[i].paths[k]
                    # killed in case it is alive (an answer that does not unpickle): waiting would never end
                    code = _reap(w, kill=True)
                    # past the first read's CPU allowance: read again, measured, so a bomb is refused by name. Not
                    # after SIGKILL: most often the kernel's OOM killer, which a second read would wake again.
                    if first and code == -signal.SIGXCPU:
                        todo.appendleft((i, k, False))
                    else:
                        st.outcome(i, k, None, LoadProblem(path, _death(code, path)), todo)
                    if todo:
                        start()
                    continue
                st.outcome(i, k, summary, problem, todo)
                feed(w)  # at once: the worker reads on while the caller merges what was handed out
                if not w.tasks:
                    sel.unregister(w.conn)
                    w.watched = False
            for w in workers:  # a path that outcome() or a death put first waits for a worker with room
                feed(w)
    finally:
        sel.close()
        for w in workers:  # idle or mid-file (an early end): nothing of theirs is needed any more
            w.conn.close()
            _reap(w, kill=True)
