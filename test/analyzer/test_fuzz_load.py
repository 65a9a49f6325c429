"""Loader fuzzing: no input file may crash the analyzer.

Random bytes, truncated and mutated valid dumps (compact, pickle and JSON; a compact dump mutated both as
its gzip bytes and as the JSON inside, then compressed again), and well-formed dumps whose
fields have the wrong types must either load or be reported as one clear per-file problem, while
the other ranks are still analysed; the report renders and the CLI exits 0/1/2. Pickles that
reference any class or function are refused and never run. Pickles whose values share references
nested in one another (memo bombs) and deeply nested JSON are refused within their bound.

Every example is measured: CPU time and resident-memory growth of reading, analysing and rendering it,
each under a hard limit (LIMIT_CPU_S, LIMIT_BYTES), and nothing the unpickler does may import,
execute or call anything (an audit hook and a wrapper around find_class watch it).
FRNCCL_FUZZ_REPORT=FILE writes the figures (examples, slowest, peak memory) as JSON.
"""

import atexit
import codecs
import contextlib
import copy
import io
import json
import os
import pickle
import resource
import secrets
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import gzip

import pytest
from fr_backend import compact
from fr_backend.analyzer.cli import main
from fr_backend.analyzer.html import render
from fr_backend.analyzer import dumpfile
from fr_backend.analyzer import load as load_mod
from fr_backend.analyzer.load import DumpError, UnsafePickleError, load_dump
from fr_backend.analyzer.report import exit_code, run, to_json, to_text
from fr_backend.analyzer.synth import Job
from fr_backend.analyzer.trace import build_trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Deterministic in CI (the same 200 examples each run, so a run cannot fail by chance);
# FRNCCL_FUZZ_EXPLORE=N draws N fresh random examples per test instead.
_EXPLORE = int(os.environ.get("FRNCCL_FUZZ_EXPLORE", "0") or 0)
FUZZ = settings(max_examples=_EXPLORE or 200, derandomize=not _EXPLORE, deadline=None,
                suppress_health_check=[HealthCheck.too_slow], database=None)
PYTHONPATH = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "python"))

# --------------------------------------------------------------------------- what each example may cost and do

LIMIT_CPU_S = 5.0  # CPU seconds to read, analyse and render one example (CPU: other jobs on the machine do not count)
LIMIT_BYTES = 1 << 30  # growth of resident memory (peak RSS) over the same
# Audit events that mean something ran: nothing that reads a dump may import, execute, spawn or connect.
FORBIDDEN_EVENTS = ("import", "exec", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                    "subprocess.Popen", "pickle.find_class", "ctypes.", "socket.", "shutil.", "os.remove",
                    "os.rename", "os.chmod")
ALLOWED_GLOBALS = {("torch.jit._pickle", n) for n in dumpfile._TORCH_LIST_BUILDERS}

STATS = {"examples": 0, "slowest_s": 0.0, "slowest": "", "peak_bytes": 0, "peak": "", "refused_bombs": 0}
_WATCH = {"on": False, "events": [], "globals": []}


def _audit(event, args):
    if _WATCH["on"] and event.startswith(FORBIDDEN_EVENTS):
        _WATCH["events"].append((event, repr(args)[:120]))


sys.addaudithook(_audit)  # for the whole session; it records only while an example's file is read
_find_class = load_mod.SafeUnpickler.find_class


def _watched_find_class(self, module, name):
    try:
        got = _find_class(self, module, name)
    except UnsafePickleError:
        _WATCH["globals"].append((module, name, "refused"))
        raise
    _WATCH["globals"].append((module, name, "allowed"))
    return got


_load_dump = load_mod.load_dump


def _watched_load_dump(path):  # what the analyzer's loader calls for every file
    _WATCH["on"] = True
    try:
        return _load_dump(path)
    finally:
        _WATCH["on"] = False




def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def _reset_peak_rss() -> bool:
    """Start a fresh peak-RSS mark (VmHWM) for this process (Linux 4.0+); False where that cannot be done."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@contextlib.contextmanager
def measured(what: str):
    """One example: its CPU time and the growth of resident memory within the limits, nothing run by the
    unpickler. Resident memory, not tracemalloc: a length field of 4 GiB in a 7-byte pickle makes the C
    unpickler reserve that much address space before it finds the file short, and never touch it."""
    _WATCH["events"].clear()
    _WATCH["globals"].clear()
    fresh = _reset_peak_rss()
    rss0 = _status_kib("VmRSS:") if fresh else 0
    cpu = time.process_time()
    try:
        yield
    finally:
        took = time.process_time() - cpu
        grew = (_status_kib("VmHWM:") - rss0) * 1024 if fresh else 0
    STATS["examples"] += 1
    if took > STATS["slowest_s"]:
        STATS["slowest_s"], STATS["slowest"] = took, what
    if grew > STATS["peak_bytes"]:
        STATS["peak_bytes"], STATS["peak"] = grew, what
    assert took <= LIMIT_CPU_S, f"{what}: {took:.1f} s of CPU"
    assert grew <= LIMIT_BYTES, f"{what}: resident memory grew by {grew / 2**20:.0f} MiB"
    assert not _WATCH["events"], f"{what}: {_WATCH['events'][:3]}"
    bad = [g for g in _WATCH["globals"] if g[2] == "allowed" and g[:2] not in ALLOWED_GLOBALS]
    assert not bad, f"{what}: the unpickler let {bad[:3]} through"


@pytest.fixture(scope="module", autouse=True)
def fuzz_report():
    load_mod.SafeUnpickler.find_class = _watched_find_class
    load_mod.load_dump = _watched_load_dump
    yield
    load_mod.SafeUnpickler.find_class = _find_class
    load_mod.load_dump = _load_dump
    STATS["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"\nfuzz: {STATS['examples']} examples; slowest {STATS['slowest_s']:.2f} s CPU ({STATS['slowest']}); "
          f"largest growth of resident memory {STATS['peak_bytes'] / 2**20:.1f} MiB ({STATS['peak']}); "
          f"{STATS['refused_bombs']} bombs refused; process max RSS {STATS['max_rss_mib']} MiB")
    out = os.environ.get("FRNCCL_FUZZ_REPORT")
    if out:
        with open(out, "w") as f:
            json.dump(STATS, f, indent=1)


def _job() -> Job:
    """4 ranks: collectives, a coalesced group, p2p, a batch, a second PG, and a rank that never joins."""
    j = Job(4)
    tp = j.new_pg("1", [0, 1], "tp")
    for _ in range(3):
        j.collective()
    j.coalesced([("all_reduce", [[4]]), ("all_reduce", [[8]])])
    j.collective("_all_gather_base", tp, sizes=[[4]], out_sizes=[[8]])
    j.p2p(0, 3)
    j.batch_p2p([(1, 2), (2, 1)])
    j.collective(ranks=[0, 1, 2], state="started")
    return j


def _setup() -> dict:
    # The codecs the unpickler may need (protocol-0 strings) are imported now: their first use would import them
    # from within an example, which the audit hook takes for code the file made run.
    # (and the UTF-16/32 ones json.loads picks for a plain JSON file's bytes that look like them).
    for codec in ("unicode_escape", "raw_unicode_escape", "latin-1", "ascii", "utf-16", "utf-16-le", "utf-16-be",
                  "utf-32", "utf-32-le", "utf-32-be"):
        codecs.lookup(codec)
    root = tempfile.mkdtemp(prefix="frnccl_fuzz_")
    atexit.register(shutil.rmtree, root, True)
    j = _job()
    inc = j.write(root, "pickle")
    j.write(root, "json")
    good = [os.path.join(inc, "pickle", f"frnccl_rank_{r}") for r in range(3)]
    with open(os.path.join(inc, "pickle", "frnccl_rank_3"), "rb") as f:
        seed_pickle = f.read()
    with open(os.path.join(inc, "json", "frnccl_rank_3.json"), "rb") as f:
        seed_json = f.read()
    scratch = os.path.join(root, "scratch")
    os.makedirs(scratch)
    seed_compact = compact.encode(j.dump(3))
    return {"root": root, "good": good, "pickle": seed_pickle, "json": seed_json, "dict": j.dump(3),
            "compact": seed_compact, "compact_text": gzip.decompress(seed_compact),
            "torch": pickle.dumps(j.dump(3, torch_format=True), protocol=2), "scratch": scratch}


BASE = _setup()


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue(), err.getvalue()


def check(data: bytes, json_name: bool = False, cli: bool = False, what: str = "") -> list[str]:
    """The fuzzed file is rank 3's; ranks 0-2 are good. Whatever the file holds: no exception escapes,
    it either loads, or is named in the problems with a one-line reason, or (when it says it is a rank
    already loaded) is named in that rank's conflict note and not used; the others are analysed, and every report renders;
    within the limits of measured(). Returns the file's problems."""
    path = os.path.join(BASE["scratch"], "frnccl_rank_3.json" if json_name else "frnccl_rank_3")
    with open(path, "wb") as f:
        f.write(data)
    with measured(what or f"{len(data)} bytes {data[:24]!r}"):
        return _check(path, cli)


def _check(path: str, cli: bool) -> list[str]:
    try:
        d = load_mod.load_dump(path)  # the watched one
        assert isinstance(d, dict)
    except DumpError as exc:
        assert str(exc) and "\n" not in str(exc)
    a = run(BASE["good"] + [path], jobs=1)
    assert {0, 1, 2} <= set(a.res.ranks)
    loaded = any(s.path == path for s in a.res.ranks.values())
    bad = [p for p in a.res.problems if p.path == path]
    # A file that claims a rank another file holds: the claim is decided in one note, and it is not the one used.
    ignored = [c for c in a.res.conflicts if path in c.paths and c.used != path and c.note in a.res.notes]
    assert [loaded, bool(bad), bool(ignored)].count(True) == 1, (loaded, bad, ignored)
    for p in bad:
        assert p.reason and "\n" not in p.reason and "internal error" not in p.reason, p.reason
    json.dumps(to_json(a))
    to_text(a)
    assert exit_code(a.findings) in (0, 1)
    if loaded:
        json.dumps(build_trace(a))
        render(a)
    if cli:  # the same through the command's entry point
        rc, out, err = _cli(*BASE["good"], path, "--json")
        assert rc in (0, 1) and "Traceback" not in err
        json.loads(out)
    return [p.reason for p in bad]


# --------------------------------------------------------------------------- bytes


@FUZZ
@given(st.one_of(st.binary(max_size=4096),
                 st.binary(max_size=2048).map(lambda b: b"\x80\x02" + b),
                 st.binary(max_size=2048).map(lambda b: b"\x80\x04" + b),
                 st.binary(max_size=2048).map(lambda b: b"{" + b)))
def test_random_bytes(data):
    check(data, cli=True)


@FUZZ
@given(st.sampled_from(["pickle", "json", "torch", "compact"]), st.floats(0, 1, exclude_max=True))
def test_truncated_dumps(which, frac):
    seed = BASE[which]
    check(seed[: int(len(seed) * frac)], json_name=which == "json")


_WHERE = st.integers(0, 2**32)  # a position, modulo the length: the first bytes are rarely hit
_MUTATION = st.one_of(
    st.tuples(st.just("flip"), _WHERE, st.integers(1, 255)),
    st.tuples(st.just("insert"), _WHERE, st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), _WHERE, st.integers(1, 64)),
    # a reference to an object read earlier (BINGET n, LONG_BINGET n) or to the one on top (DUP): sharing
    st.tuples(st.just("insert"), _WHERE, st.sampled_from([b"h", b"2", b"j"]).flatmap(
        lambda op: st.binary(min_size=1 if op == b"h" else 4 if op == b"j" else 0,
                             max_size=1 if op == b"h" else 4 if op == b"j" else 0).map(lambda a: op + a))),
)


def _mutate(data: bytes, muts) -> bytes:
    b = bytearray(data)
    for kind, where, arg in muts:
        i = where % len(b) if b else 0
        if kind == "flip" and b:
            b[i] ^= arg
        elif kind == "insert":
            b[i:i] = arg
        elif kind == "delete":
            del b[i:i + arg]
    return bytes(b)


@FUZZ
@given(st.sampled_from(["pickle", "json", "torch", "compact", "compact_text"]), st.lists(_MUTATION, min_size=1, max_size=8))
def test_mutated_dumps(which, muts):
    data = _mutate(BASE[which], muts)
    if which == "compact_text":  # the JSON inside mutated, then compressed again: past the gzip checks
        data = gzip.compress(data, 1)
    check(data, json_name=which == "json", cli=True)


# --------------------------------------------------------------------------- shared references, deep nesting

# Where a reader follows a value: (part of the dump, key).
_PLACES = [("top", "hostname"), ("top", "dump_detail"), ("top", "version"), ("top", "incident_id"),
           ("entry", "input_sizes"), ("entry", "output_sizes"), ("entry", "input_dtypes"), ("entry", "profiling_name"),
           ("entry", "pg_id"), ("entry", "state"), ("entry", "collective_seq_id"), ("entry", "is_p2p"),
           ("entry", "process_group"), ("frame", "name"), ("frame", "filename"), ("cfg", "desc"), ("cfg", "name"),
           ("cfg", "ranks"), ("cfg", "global_ranks"), ("cfg", "members"), ("status", "process_group"),
           ("status", "last_enqueued_collective")]


def _place(d: dict, where: str, key: str, value, every: bool) -> None:
    if where == "top":
        d[key] = value
    elif where in ("entry", "frame"):
        for e in d["entries"] if every else d["entries"][-1:]:
            target = e["frames"][0] if where == "frame" else e
            target[key] = ("0", value) if key == "process_group" else value
    elif where == "cfg":
        d["pg_config"]["0"][key] = value
    else:
        d["pg_status"]["0"][key] = value


def _shared(depth: int, fan: int, kind: str, leaf):
    """``fan`` references to the level below, ``depth`` levels: fan**depth leaves as a tree, a few bytes a
    level as a pickle (the pickler writes each shared object once and refers to it after)."""
    x = leaf
    for _ in range(depth):
        x = [x] * fan if kind == "list" else tuple([x] * fan) if kind == "tuple" else {str(i): x for i in range(fan)}
    return x


BOMBS = settings(FUZZ, max_examples=_EXPLORE or 100)


@BOMBS
@given(st.sampled_from(_PLACES), st.integers(1, 64), st.integers(2, 4), st.sampled_from(["list", "tuple", "dict"]),
       st.sampled_from(["x", 7, None, "y" * 300]), st.booleans(), st.sampled_from([2, 4, 5]))
def test_shared_references(place, depth, fan, kind, leaf, every, proto):
    """Values that share references nested in one another, in any field a reader follows: small ones load
    (or are reported as a wrong type), a bomb is refused as such within the limits."""
    d = copy.deepcopy(BASE["dict"])
    _place(d, *place, _shared(depth, fan, kind, leaf), every)
    raw = pickle.dumps(d, protocol=proto)
    reasons = check(raw, what=f"{place} {kind} fan {fan} depth {depth} proto {proto} ({len(raw)} bytes)")
    if fan ** depth > 1 << 30:  # unfolds past any file's bound
        assert any("pickle bomb" in r for r in reasons), reasons
        STATS["refused_bombs"] += 1


@settings(FUZZ, max_examples=_EXPLORE or 40)
@given(st.sampled_from(_PLACES), st.integers(1, 200_000), st.sampled_from(["[", '{"a":']), st.booleans())
def test_deep_json(place, depth, opener, as_compact):
    """JSON nested to any depth in any field, as a JSON dump or a compact one: read, or refused in one line,
    within the limits."""
    d = copy.deepcopy(BASE["dict"])
    _place(d, *place, "@@NESTED@@", False)
    closer = "]" if opener == "[" else "}"
    text = compact.encode_json(d) if as_compact else json.dumps(d)
    raw = text.replace('"@@NESTED@@"', opener * depth + "1" + closer * depth).encode()
    if as_compact:
        raw = gzip.compress(raw, 1)
    check(raw, json_name=not as_compact, what=f"{'compact' if as_compact else 'JSON'} {place} nested {depth} deep "
                                              f"({len(raw)} bytes)")


# --------------------------------------------------------------------------- wrong types

_PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**62, max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=6) | st.integers(-3, 3), inner, max_size=4),
    max_leaves=12,
)
_TOP_KEYS = ["version", "format", "rank", "world_size", "entries", "pg_config", "pg_status", "clock", "pid",
             "hostname", "thread_stacks", "dump_time_ns", "trigger_rank", "buffer_size", "incident_id"]
_ENTRY_KEYS = ["record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "profiling_name",
               "time_created_ns", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "is_p2p", "peer",
               "state", "time_discovered_started_ns", "time_discovered_completed_ns", "time_gpu_started_ns", "frames"]
_CFG_KEYS = ["name", "desc", "ranks", "global_ranks", "members"]
_STATUS_KEYS = ["last_enqueued_collective", "last_completed_collective", "last_enqueued_p2p",
                "last_dropped_collective", "last_dropped_p2p", "process_group"]


def _edit(d: dict, data) -> None:
    """One edit somewhere in the dump: a field replaced by a value of any plain type, or removed."""
    where = data.draw(st.sampled_from(["top", "entry", "entries", "cfg", "status"]))
    if where == "top":
        target, key = d, data.draw(st.sampled_from(_TOP_KEYS))
    elif where in ("entry", "entries") and isinstance(d.get("entries"), list) and d["entries"]:
        key = data.draw(st.sampled_from(_ENTRY_KEYS))
        if where == "entries":  # the same change in every entry: the column-wise fast paths see it
            value = data.draw(_PLAIN)
            for e in d["entries"]:
                if isinstance(e, dict):
                    e[key] = copy.deepcopy(value)
            return
        i = data.draw(st.integers(0, len(d["entries"]) - 1))
        target = d["entries"][i]
        if not isinstance(target, dict) or data.draw(st.integers(0, 9)) == 0:
            d["entries"][i] = data.draw(_PLAIN)  # the entry itself is not a dict
            return
    elif where == "cfg" and isinstance(d.get("pg_config"), dict) and d["pg_config"]:
        target = d["pg_config"][data.draw(st.sampled_from(sorted(d["pg_config"], key=str)))]
        key = data.draw(st.sampled_from(_CFG_KEYS))
        if not isinstance(target, dict):
            return
    elif where == "status" and isinstance(d.get("pg_status"), dict) and d["pg_status"]:
        target = d["pg_status"][data.draw(st.sampled_from(sorted(d["pg_status"], key=str)))]
        key = data.draw(st.sampled_from(_STATUS_KEYS))
        if not isinstance(target, dict):
            return
    else:
        return
    if data.draw(st.integers(0, 4)) == 0:
        target.pop(key, None)
    else:
        target[key] = data.draw(_PLAIN)


@FUZZ
@given(st.data())
def test_wrong_types(data):
    d = copy.deepcopy(BASE["dict"])
    for _ in range(data.draw(st.integers(1, 4))):
        _edit(d, data)
    enc = data.draw(st.sampled_from(["pickle4", "pickle2", "json", "compact"]))
    if enc == "compact":  # the wrong values land in the columns (of the form the encoder picks for them)
        try:
            raw = compact.encode(d, 1)
        except (AttributeError, TypeError, ValueError, RecursionError):  # entries not a list of dicts
            return
    elif enc == "json":
        try:
            raw = json.dumps(d, default=repr).encode()
        except (ValueError, TypeError):  # keys json cannot write
            return
    else:
        try:
            raw = pickle.dumps(d, protocol=4 if enc == "pickle4" else 2)
        except RecursionError:
            return
    check(raw, json_name=enc == "json")


@pytest.mark.parametrize("bad", [
    {"entries": 7}, {"entries": "x"}, {"entries": [1, 2]}, {"entries": [{}]}, {"pg_config": [1]},
    {"pg_status": "s"}, {"rank": "3"}, {"rank": 0}, {"rank": False}, {"version": 3}, {"version": None}, {"clock": [1]},
    {"entries": [{"process_group": 5, "profiling_name": "nccl:all_reduce"}]},
    {"entries": [{"process_group": ["0"], "profiling_name": "nccl:all_reduce"}]},
    {"entries": [{"process_group": ["0", "default_pg"], "profiling_name": ["x"]}]},
    {"entries": [{"process_group": [["0"], {}], "profiling_name": "nccl:all_reduce"}]},
])
def test_wrong_type_examples(bad):
    d = copy.deepcopy(BASE["dict"])
    d.update(bad)
    check(pickle.dumps(d, protocol=4))
    check(json.dumps(d).encode(), json_name=True)


def test_odd_values_in_every_entry():
    """Types the column-wise path does not expect, in every entry at once."""
    for key, value in [("collective_seq_id", "5"), ("collective_seq_id", None), ("collective_seq_id", 2**70),
                       ("time_created_ns", 1.5e18), ("time_created_ns", "now"), ("time_created_ns", 2**80),
                       ("state", ["completed"]), ("state", None), ("input_sizes", "[[4]]"), ("is_p2p", None),
                       ("is_p2p", "no"), ("record_id", -(2**70)), ("process_group", ("0",)),
                       ("profiling_name", 5), ("input_dtypes", {"a": 1})]:
        d = copy.deepcopy(BASE["dict"])
        for e in d["entries"]:
            e[key] = value
        check(pickle.dumps(d, protocol=4))


# --------------------------------------------------------------------------- malicious pickles


class _Evil:
    def __init__(self, cmd: str):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def _marker() -> str:
    return os.path.join(tempfile.gettempdir(), f"pwned_{secrets.token_hex(8)}")


def _payloads(marker: str) -> list[bytes]:
    cmd = f"touch {marker}"
    c = cmd.encode()
    p = [pickle.dumps(_Evil(cmd), protocol=proto) for proto in range(pickle.HIGHEST_PROTOCOL + 1)]
    p.append(pickle.dumps({"version": "2.10", "entries": [], "pg_config": {}, "x": _Evil(cmd)}, protocol=2))
    p.append(b"cos\nsystem\n(V" + c + b"\ntR.")  # GLOBAL + REDUCE, by hand
    p.append(b"cposix\nsystem\n(V" + c + b"\ntR.")
    p.append(b"(V" + c + b"\nios\nsystem\n.")  # INST
    p.append(b"\x80\x02cos\nsystem\nq\x00V" + c + b"\nq\x01\x85q\x02Rq\x03.")
    p.append(b"\x80\x04\x95" + struct.pack("<Q", 0) + b"\x8c\x02os\x8c\x06system\x93\x8c" + bytes([len(c)]) + c
             + b"\x85R.")  # STACK_GLOBAL
    p.append(b"(cbuiltins\neval\nV__import__('os').system('" + c + b"')\no.")  # OBJ via MARK
    p.append(b"\x80\x02(cbuiltins\nexec\nX" + struct.pack("<I", len(c) + 30)
             + b"import os;os.system('" + c + b"')"[: len(c) + 30] + b"tR.")
    return p


def test_malicious_pickles_refused_never_run():
    marker = _marker()
    for i, data in enumerate(_payloads(marker)):
        path = os.path.join(BASE["scratch"], f"evil_rank_{i}")
        with open(path, "wb") as f:
            f.write(data)
        with pytest.raises(DumpError):
            load_dump(path)
        assert not os.path.exists(marker), f"payload {i} ran"
    a = run(BASE["good"] + [os.path.join(BASE["scratch"], "evil_rank_2")], jobs=1)  # protocol 2, like torch's
    assert not os.path.exists(marker)
    assert sorted(a.res.ranks) == [0, 1, 2]
    assert [os.path.basename(p.path) for p in a.res.problems] == ["evil_rank_2"]
    assert "refused" in a.res.problems[0].reason


def test_malicious_pickle_refused_by_unpickler_class():
    marker = _marker()
    with pytest.raises(UnsafePickleError):
        from fr_backend.analyzer.load import safe_loads

        safe_loads(pickle.dumps(_Evil(f"touch {marker}"), protocol=2))
    assert not os.path.exists(marker)


@FUZZ
@given(st.data())
def test_malicious_value_anywhere_is_refused(data):
    """An os.system payload hidden in any field of an otherwise valid dump."""
    marker = _marker()
    d = copy.deepcopy(BASE["dict"])
    evil = _Evil(f"touch {marker}")
    where = data.draw(st.sampled_from(["top", "entry", "cfg", "frames"]))
    if where == "top":
        d[data.draw(st.sampled_from(_TOP_KEYS))] = evil
    elif where == "entry":
        d["entries"][data.draw(st.integers(0, len(d["entries"]) - 1))][data.draw(st.sampled_from(_ENTRY_KEYS))] = evil
    elif where == "cfg":
        d["pg_config"]["0"][data.draw(st.sampled_from(_CFG_KEYS))] = evil
    else:
        d["entries"][-1]["frames"] = [{"name": evil}]
    raw = pickle.dumps(d, protocol=data.draw(st.integers(2, pickle.HIGHEST_PROTOCOL)))
    path = os.path.join(BASE["scratch"], "frnccl_rank_3")
    with open(path, "wb") as f:
        f.write(raw)
    with pytest.raises(UnsafePickleError):
        load_dump(path)
    a = run(BASE["good"] + [path], jobs=1)
    assert [p.path for p in a.res.problems] == [path] and "refused" in a.res.problems[0].reason
    assert not os.path.exists(marker)


# --------------------------------------------------------------------------- the CLI, for real


def test_cli_subprocess_on_a_folder_of_bad_files(tmp_path):
    """One interpreter run over good ranks, garbage, truncated, mutated, wrong-type and malicious files:
    exit 1 (the hang is still found), every bad file named, no traceback; a folder of garbage only: exit 2."""
    marker = _marker()
    d = tmp_path / "mixed"
    d.mkdir()
    for r, p in enumerate(BASE["good"]):
        with open(p, "rb") as f:
            (d / f"frnccl_rank_{r}").write_bytes(f.read())
    bad = {
        "frnccl_rank_3": os.urandom(300),
        "frnccl_rank_4": BASE["pickle"][: len(BASE["pickle"]) // 3],
        "frnccl_rank_5.json": BASE["json"][: len(BASE["json"]) // 2],
        "frnccl_rank_6": _mutate(BASE["pickle"], [("flip", len(BASE["pickle"]) // 2, 0x55), ("delete", 900, 9)]),
        "frnccl_rank_7": pickle.dumps({**BASE["dict"], "rank": 7, "entries": 3}, protocol=4),
        "frnccl_rank_8": pickle.dumps(_Evil(f"touch {marker}"), protocol=2),
    }
    for name, data in bad.items():
        (d / name).write_bytes(data)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PYTHONPATH, env.get("PYTHONPATH", "")) if p)
    p = subprocess.run([sys.executable, "-m", "fr_backend.analyzer", str(d), "--json"], capture_output=True, text=True,
                       env=env, timeout=120, check=False)
    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    out = json.loads(p.stdout)
    named = {os.path.basename(u["path"]) for u in out["unreadable_files"]}
    assert {"frnccl_rank_3", "frnccl_rank_4", "frnccl_rank_5.json", "frnccl_rank_8"} <= named
    assert not os.path.exists(marker)
    for name in ("frnccl_rank_0", "frnccl_rank_1", "frnccl_rank_2"):
        (d / name).unlink()
    for name in ("frnccl_rank_6", "frnccl_rank_7"):
        (d / name).write_bytes(b"\x80\x02garbage")
    rc, _, err = _cli(str(d))
    assert rc == 2 and "no usable dump" in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(marker)
