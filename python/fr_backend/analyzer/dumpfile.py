"""Reading one dump file, safely: its bytes, then its raw dict (compact, JSON or pickle), with bounds.

Safety: pickles go through :class:`SafeUnpickler`, which builds plain types only
(dict, list, tuple, str, bytes, int, float, bool, None). Any pickle that names a
class or function (``GLOBAL``/``STACK_GLOBAL``, which is how ``os.system`` and
friends get in) is refused before anything is called. The one exception is the
``torch.jit._pickle.build_*list`` helpers that TorchScript's pickler may emit for
typed lists: they are mapped to our own ``list`` builder, never imported. What
unpickling and parsing may allocate is bounded (address_space), and anything but a
regular file is refused before a byte is read (read_regular).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import stat
from collections.abc import Callable, Iterator
from typing import Any

from fr_backend import compact

from . import bounds
from .model import DumpError, first_line

MAX_DUMP_BYTES = 4 << 30
_TORCH_LIST_BUILDERS = {"build_intlist", "build_doublelist", "build_boollist", "build_tensorlist", "build_strlist",
                        "build_list"}


class UnsafePickleError(DumpError, pickle.UnpicklingError):
    """A pickle tried to reference a class or function."""


def shown(s: str) -> str:
    """A name from the file, fit for a one-line message (escaped, cut)."""
    s = s.encode("unicode_escape").decode("ascii")
    return s if len(s) <= 40 else s[:40] + "..."


def _build_list(items: Any) -> list[Any]:
    return list(items)


class SafeUnpickler(pickle.Unpickler):
    """Unpickler that refuses every global: only plain data can come out."""

    def find_class(self, module: str, name: str) -> Callable[..., Any]:
        if module == "torch.jit._pickle" and name in _TORCH_LIST_BUILDERS:
            return _build_list
        raise UnsafePickleError(f"refused to load {shown(module)}.{shown(name)}: dumps may contain plain data only")

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("refused a persistent id: dumps may contain plain data only")


# Address space the C unpickler may take beyond what the process has, for ``data`` of n bytes. A plain
# dump's objects take 5-20 times its pickle; a memo index (LONG_BINPUT 123217920: a 5-byte opcode made
# the unpickler zero a 1.9 GB memo table) or a length field far past the end of the file asks for more.
UNPICKLE_FLOOR = 256 << 20
UNPICKLE_PER_BYTE = 64


def _address_space_limit(extra: int) -> tuple[int, int, int] | None:
    """(the lowered soft limit, the soft and hard limits now) for RLIMIT_AS at what the process holds plus
    ``extra`` bytes; None where it cannot be read or is already lower."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            held = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError, IndexError):
        return None
    want = held + extra
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if soft != resource.RLIM_INFINITY and soft <= want:
        return None
    return want, soft, hard


# Whether unpickling lowers RLIMIT_AS (guard_address_space): off unless a process that does nothing else asks.
_GUARD_ADDRESS_SPACE = False
# Whether load_dump measures a pickle's whole unfolded tree (bounds.check: a quarter of a torch dump's read and
# reduction, nearly all of it the entries). Off only in a reader worker (workers.py) while the kernel bounds its
# address space and CPU time over the whole read and reduction: then everything but the entries is measured, a
# bomb in the entries costs no more than those limits allow, and the summary, the one thing that leaves the
# worker, is measured instead.
_MEASURE_TREE = True


def guard_address_space(on: bool = True) -> None:
    """Let reading a dump lower this process's address-space limit while it unpickles (see address_space).
    RLIMIT_AS is the whole process's: only a process whose other threads cannot allocate meanwhile may turn
    this on, as the analyzer's command line does. Never in a training job: `fr_backend.load_dump()` and
    `trace_entries()` there leave the limit alone, and another thread's allocation must not fail for it."""
    global _GUARD_ADDRESS_SPACE
    _GUARD_ADDRESS_SPACE = on


@contextlib.contextmanager
def measure_tree(on: bool) -> Iterator[None]:
    """Whether load_dump measures a pickle's unfolded tree, for the duration (see _MEASURE_TREE)."""
    global _MEASURE_TREE
    was, _MEASURE_TREE = _MEASURE_TREE, on
    try:
        yield
    finally:
        _MEASURE_TREE = was


@contextlib.contextmanager
def address_space(extra: int) -> Iterator[bool]:
    """RLIMIT_AS lowered to what the process holds now plus ``extra`` bytes, for the duration: an allocation
    past it raises MemoryError instead of taking the machine's memory. Only where guard_address_space() is on;
    where the limit cannot be read or set (not Linux), nothing is done. Yields whether the limit is in force
    (False also where an earlier, lower one already is)."""
    limits = _address_space_limit(extra) if _GUARD_ADDRESS_SPACE else None
    if limits is not None:
        import resource  # there: _address_space_limit read it

        try:
            resource.setrlimit(resource.RLIMIT_AS, (limits[0], limits[2]))
        except (OSError, ValueError):
            limits = None
    try:
        yield limits is not None
    finally:
        if limits is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limits[1], limits[2]))


def safe_loads(data: bytes) -> Any:
    # BufferedReader gives the C unpickler peek(): it then reads in big chunks instead of
    # calling read() per opcode (protocol-2 pickles, as torch writes them, have no frames).
    with address_space(UNPICKLE_FLOOR + UNPICKLE_PER_BYTE * len(data)):
        return SafeUnpickler(io.BufferedReader(io.BytesIO(data), buffer_size=1 << 20)).load()


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def read_regular(p: str) -> bytes:
    """The bytes of a regular file, at most MAX_DUMP_BYTES. Anything else (a FIFO, /dev/zero,
    /dev/urandom, a socket) is refused before a byte is read: it could block or never end."""
    try:
        # O_NONBLOCK: opening a FIFO without a writer would wait forever; regular files ignore it.
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise DumpError(f"cannot read: {exc.strerror or exc}") from None
    with open(fd, "rb", buffering=0) as f:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                what = next((w for test, w in _KINDS if test(st.st_mode)), "not a regular file")
                raise DumpError(f"not a regular file ({what}); skipped")
            if st.st_size > MAX_DUMP_BYTES:
                raise DumpError(f"file too large ({st.st_size} bytes, limit {MAX_DUMP_BYTES})")
            # st_size may be 0 (/proc) or stale (a file still growing): read in chunks, never past the limit
            chunks: list[bytes] = []
            total = 0
            want = st.st_size + 1
            while total <= MAX_DUMP_BYTES:
                chunk = f.read(min(max(want, 1 << 16), MAX_DUMP_BYTES + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
                want = 1 << 22
        except OSError as exc:
            raise DumpError(f"cannot read: {exc.strerror or exc}") from None
    if total > MAX_DUMP_BYTES:
        raise DumpError(f"file too large (more than {MAX_DUMP_BYTES} bytes)")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# What parsing a compact dump may take, beyond the process's size: a floor, and so much a byte of file. Gzip
# inflates up to ~1000:1 and the parsed JSON takes ~24 bytes a byte of text, so a 1 MB file could take 25 GB;
# a real 20,000-entry dump takes ~150 bytes a byte of file (30 MB), an evenly repetitive one ~22,000 (130 MB
# from 6 KB), which the floor covers. What the entries decode to is counted before it is built
# (compact.unfolded_bytes); this bound is what is left: the parse itself.
COMPACT_FLOOR = 256 << 20
COMPACT_PER_BYTE = 4096
JSON_PER_BYTE = 64  # parsed JSON: at most ~24 bytes a byte of text ("[[],[],...": an empty list per 3 bytes)


def parse_compact(data: bytes, rows: bool = False) -> dict[str, Any]:
    """A compact dump's bytes -> its parsed object (columns), or with ``rows`` the row form. What it inflates
    and what shared table values unfold to are bounded by compact itself (JSON shares nothing); the memory
    that takes is bounded here, as unpickling is (address_space)."""
    try:
        with address_space(COMPACT_FLOOR + COMPACT_PER_BYTE * len(data)):
            obj = compact.parse(data)
            return compact.to_rows(obj) if rows else obj
    except MemoryError:
        raise DumpError(f"refused: reading it takes more memory than a compact dump of {len(data)} bytes can "
                        "(it inflates far past what a dump holds)") from None


def load_dump(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load one dump file (compact, pickle or JSON, frnccl or torch) safely; return the raw dict
    in the row form (``entries`` a list of dicts).

    Raises DumpError (with a one-line reason) for anything that is not a dump."""
    return parse_dump(read_regular(os.fspath(path)))


def parse_dump(data: bytes) -> dict[str, Any]:
    """A dump file's bytes -> its raw dict, as load_dump gives it (raises DumpError as it does)."""
    if not data:
        raise DumpError("empty file")
    head = data[:64].lstrip()
    if compact.is_compact(data):
        obj = parse_compact(data, rows=True)
        if "entries" not in obj and "pg_config" not in obj:
            raise DumpError("not a flight-recorder dump (no entries or pg_config)")
        bounds.normalize(obj)
        return obj
    if head[:1] in (b"{", b"["):
        try:
            with address_space(COMPACT_FLOOR + JSON_PER_BYTE * len(data)):
                obj = json.loads(data)
        except MemoryError:
            raise DumpError(f"refused: parsing it takes more memory than a JSON dump of {len(data)} bytes "
                            "can") from None
        except (ValueError, RecursionError) as exc:
            raise DumpError(f"corrupt or truncated JSON ({first_line(exc)})") from None
    elif data[:1] == b"\x80" or data[:1] in (b"(", b"}", b"]"):
        try:
            obj = safe_loads(data)
        except UnsafePickleError:
            raise
        except MemoryError:
            raise DumpError(f"refused: reading it takes more memory than a dump of {len(data)} bytes can (a memo "
                            "index or a length far past the end of the file)") from None
        except Exception as exc:  # noqa: BLE001 - whatever the C unpickler makes of damaged bytes
            msg = first_line(exc)
            raise DumpError(f"corrupt or truncated pickle ({msg})") from None
    else:
        raise DumpError("not a pickle or JSON file")
    if not isinstance(obj, dict):
        raise DumpError(f"not a flight-recorder dump (top level is {type(obj).__name__}, not dict)")
    if obj.get("encoding") in compact.ENCODINGS:
        # A compact dump written uncompressed (a host without libz): the same bounds as a gzip'ed one.
        obj["_inflated_bytes"] = len(data)
        obj = compact.to_rows(obj)
        if "entries" not in obj and "pg_config" not in obj:
            raise DumpError("not a flight-recorder dump (no entries or pg_config)")
        bounds.normalize(obj)
        return obj
    if "entries" not in obj and "pg_config" not in obj:
        raise DumpError("not a flight-recorder dump (no entries or pg_config)")
    if _MEASURE_TREE:
        bounds.check(obj, len(data))
    else:  # the entries are bounded by the worker's limits where the reduction follows them; nothing else is
        bounds.check({k: v for k, v in obj.items() if k != "entries"}, len(data))
    bounds.normalize(obj)
    return obj
