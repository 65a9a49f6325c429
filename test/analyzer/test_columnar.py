"""The columnar reading of compact dumps (analyzer/columnar.py) gives the row path's summary, and the
row path's per-file problems for damaged columns. (A real job's dumps: test_recorder.py.)"""

import gzip
import json
import os
import random

import pytest

from fr_backend import compact
from fr_backend.analyzer import columnar, dumpfile, load, synth
from fr_backend.analyzer.load import Candidate, DumpError, _load_one, load_dump, summarize
from fr_backend.analyzer.synth import Job


def _files(d):
    folder = os.path.join(d, "compact")
    return sorted(os.path.join(folder, f) for f in os.listdir(folder))


def _both(path, monkeypatch):
    """(summary, problems) of one file through the columns, then through the rows."""
    cand = Candidate(None, [path])
    got = _load_one(cand)
    with monkeypatch.context() as m:
        m.setattr(load, "read_dump", load_dump)
        want = _load_one(cand)
    return got, want


def _no_rows(m):
    def refuse(obj):
        raise AssertionError("the row path was taken")
    m.setattr(columnar, "_rows", refuse)


def _coalesced_job():
    j = Job(4)
    for _ in range(5):
        j.collective("all_reduce")
    j.coalesced([("all_reduce", [[4]]), ("all_reduce", [[8]])])
    j.collective("broadcast", state={0: "started", 1: "started", 2: "scheduled", 3: "completed"})
    return j, []


def _p2p_job():
    j = Job(4)
    j.collective("all_reduce")
    j.p2p(0, 1)
    j.batch_p2p([(2, 3), (3, 2)])
    j.p2p(1, 2, recv=False, state="scheduled")
    return j, []


def _truncated_job():
    j = Job(8, buffer_size=30)
    tp = [j.new_pg(f"tp{i}", [2 * i, 2 * i + 1], "tp") for i in range(4)]
    for i in range(40):
        j.collective("all_reduce", sizes=[[i % 3 + 1]], dtype="Float" if i % 2 else "BFloat16")
        j.collective("_all_gather_base", tp[i % 4], sizes=[[4]], out_sizes=[[8]])
    j.collective("all_reduce", ranks=[r for r in range(8) if r != 5], state="started")
    for r in range(8):
        j.truncate(r, 30 - r)  # each rank lost a different part of its history
    return j, [5]


def _failed_job():
    j = Job(4)
    for _ in range(3):
        j.collective("all_reduce")
    j.collective("reduce_scatter", sizes=[[4], [4]], out_sizes=[[4]])
    j.collective("barrier", sizes=[[1]])
    j.collective("all_to_all", sizes=[[4]], state={0: "started", 1: "started", 2: "completed", 3: "scheduled"})
    for r in (0, 1):  # retired without completing: failed
        j.ranks[r].entries[-1]["retired"] = True
    return j, []


SHAPES = {
    "healthy_mesh": lambda: synth.healthy_mesh(16, steps=12),
    "mesh_skip": lambda: synth.mesh_skip(16, 6, steps=8),
    "straggler_mesh": lambda: synth.straggler_mesh(16, 9, steps=10),
    "pipeline_async": lambda: synth.pipeline_async(8, 3, steps=6),
    "p2p": _p2p_job,
    "coalesced": _coalesced_job,
    "truncated": _truncated_job,
    "failed": _failed_job,
}
# shapes read from columns alone (no p2p op, no coalesced group)
COLUMNAR = {"healthy_mesh", "mesh_skip", "straggler_mesh", "truncated", "truncated_no_dropped", "failed"}


def _no_dropped(cols, obj):
    """pg_status without last_dropped_*: where history was cut is inferred, from the oldest entry kept."""
    for st in obj["pg_status"].values():
        st.pop("last_dropped_collective", None)
        st.pop("last_dropped_p2p", None)


@pytest.mark.parametrize("shape", sorted(SHAPES) + ["truncated_no_dropped"])
def test_same_summary_as_rows(shape, tmp_path, monkeypatch):
    job, _ = SHAPES[shape.replace("_no_dropped", "")]()
    d = job.write(tmp_path, "compact")
    if shape.endswith("_no_dropped"):
        for path in _files(d):
            _rewrite(path, _no_dropped)
    for path in _files(d):
        want = summarize(load_dump(path), path, None)
        with monkeypatch.context() as m:
            if shape in COLUMNAR:
                _no_rows(m)
            got = summarize(columnar.read_dump(path), path, None)
        assert got == want, path
        assert got.n_entries > 0 and got.pgs


def _lists(obj):
    """The dump as columns-1 writes it: every packed column (hex digits, coded index) as a JSON list."""
    n = obj["entries"]["count"]
    for key, col in obj["entries"]["columns"].items():
        if isinstance(col, dict) and isinstance(col.get("delta"), str):
            d = list(compact.packed_ints(col["delta"], n, key))
            d[0] += col.pop("start", 0)
            col["delta"] = d
        elif isinstance(col, dict) and isinstance(col.get("values"), str):
            packed = compact.packed_ints(col["values"], n, key)
            col["values"] = [None if v == compact.null_of(packed) else v for v in packed]
        elif isinstance(col, dict) and isinstance(col.get("index"), str):
            col["index"] = list(compact.positions(col["index"], len(col["table"]), n, key))
    obj["encoding"] = "columns-1"


def _rewrite(path, fn, lists=True):
    obj = json.loads(gzip.decompress(open(path, "rb").read()))
    if lists:
        _lists(obj)
    fn(obj["entries"]["columns"], obj)
    with open(path, "wb") as f:
        f.write(gzip.compress(json.dumps(obj).encode()))


DAMAGE = {
    "seq delta is text": lambda c, o: c.__setitem__("collective_seq_id", {"delta": ["1"] * o["entries"]["count"]}),
    "seq as floats": lambda c, o: c.__setitem__("collective_seq_id", [float(i + 1) for i in range(o["entries"]["count"])]),
    "seq with nulls": lambda c, o: c.__setitem__("collective_seq_id", [None] * o["entries"]["count"]),
    "state index out of range": lambda c, o: c["state"]["index"].__setitem__(0, 99),
    "state index negative": lambda c, o: c["state"]["index"].__setitem__(0, -1),
    "state index a float": lambda c, o: c["state"]["index"].__setitem__(0, 0.0),
    "state index a bool": lambda c, o: c["state"]["index"].__setitem__(0, False),
    "state is a number": lambda c, o: c.__setitem__("state", {"table": [7], "index": [0] * o["entries"]["count"]}),
    "times as text": lambda c, o: c.__setitem__("time_created_ns", ["x"] * o["entries"]["count"]),
    "offset of text": lambda c, o: c["time_discovered_started_ns"].__setitem__("values", ["1"] * o["entries"]["count"]),
    "offset from nothing": lambda c, o: c["time_discovered_started_ns"].__setitem__("offset_from", "nope"),
    "is_p2p as text": lambda c, o: c.__setitem__("is_p2p", ["no"] * o["entries"]["count"]),
    "is_p2p missing": lambda c, o: c.pop("is_p2p"),
    "profiling_name missing": lambda c, o: c.pop("profiling_name"),
    "profiling_name null": lambda c, o: c["profiling_name"]["table"].__setitem__(0, None),
    "profiling_name a number": lambda c, o: c["profiling_name"]["table"].__setitem__(0, 5),
    "process_group a string": lambda c, o: c["process_group"]["table"].__setitem__(0, "0"),
    "process_group of numbers": lambda c, o: c["process_group"]["table"].__setitem__(0, [0, 1]),
    "process_group null": lambda c, o: c["process_group"]["table"].__setitem__(0, None),
    "process_group a dict": lambda c, o: c["process_group"]["table"].__setitem__(0, {"a": 1}),
    "sizes a string": lambda c, o: c["input_sizes"]["table"].__setitem__(0, "[[4]]"),
    "dtypes a number": lambda c, o: c["input_dtypes"]["table"].__setitem__(0, 3),
    "short column": lambda c, o: c.__setitem__("retired", [True]),
    "unknown form": lambda c, o: c.__setitem__("peer", {"what": 1}),
    "column not a list": lambda c, o: c.__setitem__("peer", 5),
    "count too large": lambda c, o: o["entries"].__setitem__("count", o["entries"]["count"] + 1),
    "count negative": lambda c, o: o["entries"].__setitem__("count", -1),
    "count a string": lambda c, o: o["entries"].__setitem__("count", "3"),
    "columns a list": lambda c, o: o["entries"].__setitem__("columns", []),
    "record_id floats": lambda c, o: c.__setitem__("record_id", [i + 0.5 for i in range(o["entries"]["count"])]),
    "retired as numbers": lambda c, o: c.__setitem__("retired", [1] * o["entries"]["count"]),
    "frames a string": lambda c, o: c["frames"]["table"].__setitem__(0, "train.py"),
    "pg_id a list": lambda c, o: c["pg_id"]["table"].__setitem__(0, [1]),
    "version wrong": lambda c, o: o.__setitem__("version", "9.0"),
    "pg_config a list": lambda c, o: o.__setitem__("pg_config", []),
    "pg_status of numbers": lambda c, o: o.__setitem__("pg_status", {"0": 5}),
    "rank negative": lambda c, o: o.__setitem__("rank", -3),
    "entries a list": lambda c, o: o.__setitem__("entries", []),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_columns_same_problems(damage, tmp_path, monkeypatch):
    job, _ = synth.mesh_skip(8, 2, steps=3)
    d = job.write(tmp_path, "compact")
    path = _files(d)[1]
    _rewrite(path, DAMAGE[damage])
    got, want = _both(path, monkeypatch)
    assert got == want
    summary, problems = got
    assert summary is not None or problems  # something either way, never a traceback


def _packed(key, fn):
    def damage(c, o):
        col = c[key]
        field = "delta" if "delta" in col else "values" if "values" in col else "index"
        assert isinstance(col[field], str)  # as frnccl writes it
        col[field] = fn(col[field], o["entries"]["count"])
    return damage


PACKED_DAMAGE = {
    "delta short a digit": _packed("collective_seq_id", lambda s, n: s[:-1]),
    "delta a value short": _packed("collective_seq_id", lambda s, n: s[:-(len(s) // n)]),
    "delta a value long": _packed("time_created_ns", lambda s, n: s + "0" * (len(s) // n)),
    "delta 3 digits each": _packed("collective_seq_id", lambda s, n: "0" * 3 * n),
    "delta 32 digits each": _packed("collective_seq_id", lambda s, n: "0" * 32 * n),
    "delta wider": _packed("collective_seq_id", lambda s, n: "".join(
        ("ff" * 8 if s[i] in "89abcdef" else "00" * 8)[:16 - len(s) // n] + s[i:i + len(s) // n]
        for i in range(0, len(s), len(s) // n))),
    "delta start a string": lambda c, o: c["time_created_ns"].__setitem__("start", "5"),
    "delta start a float": lambda c, o: c["time_created_ns"].__setitem__("start", 5.0),
    "delta start moved": lambda c, o: c["time_created_ns"].__setitem__("start", c["time_created_ns"]["start"] + 7),
    "delta not hex": _packed("collective_seq_id", lambda s, n: "g" + s[1:]),
    "delta with a space": _packed("time_created_ns", lambda s, n: s[:8] + " " + s[9:]),
    "delta not ascii": _packed("collective_seq_id", lambda s, n: "\u00e9" + s[1:]),
    "delta upper case": _packed("time_created_ns", lambda s, n: s.upper()),
    "offset not hex": _packed("time_discovered_started_ns", lambda s, n: s[:-1] + "z"),
    "offset short": _packed("time_discovered_completed_ns", lambda s, n: s[:-(len(s) // n)]),
    "offset all null": _packed("time_discovered_started_ns", lambda s, n: "8000" * n),
    "offset one null": _packed("time_discovered_completed_ns", lambda s, n: "8" + "0" * (len(s) // n - 1)
                               + s[len(s) // n:]),
    "index past its table": _packed("state", lambda s, n: "z" + s[1:]),
    "index not in the alphabet": _packed("profiling_name", lambda s, n: "!" + s[1:]),
    "index not ascii": _packed("state", lambda s, n: "\u00e9" + s[1:]),
    "index short": _packed("process_group", lambda s, n: s[:-1]),
    "index long": _packed("input_sizes", lambda s, n: s + "0"),
    "index empty": _packed("state", lambda s, n: ""),
}


@pytest.mark.parametrize("damage", sorted(PACKED_DAMAGE))
def test_damaged_packed_columns_same_problems(damage, tmp_path, monkeypatch):
    """Packed columns (hex digits, coded indexes) that are damaged: the same summary or the same problem as the
    row path, and anything wrong is said in one line."""
    job, _ = synth.mesh_skip(8, 2, steps=3)
    d = job.write(tmp_path, "compact")
    path = _files(d)[1]
    _rewrite(path, PACKED_DAMAGE[damage], lists=False)
    got, want = _both(path, monkeypatch)
    assert got == want
    summary, problems = got
    if damage in ("delta upper case", "offset all null", "offset one null", "delta wider", "delta start moved"):
        assert summary is not None and not problems  # what the form allows
    else:
        assert summary is None and len(problems) == 1 and "\n" not in problems[0].reason, problems


def test_index_code_for_a_table_past_64_values_is_refused(tmp_path, monkeypatch):
    """A coded index names one of the first 64 values only: a code past them (byte 255 for a character outside
    the alphabet) is never taken for a position in a longer table."""
    job, _ = synth.mesh_skip(8, 2, steps=3)
    d = job.write(tmp_path, "compact")
    path = _files(d)[1]

    def fn(c, o):
        c["state"]["table"] += ["completed"] * 300
        c["state"]["index"] = "!" + c["state"]["index"][1:]
    _rewrite(path, fn, lists=False)
    got, want = _both(path, monkeypatch)
    assert got == want and got[0] is None and "not a position in its table" in got[1][0].reason


def test_packed_and_list_forms_same_summary(tmp_path, monkeypatch):
    """A columns-1 file (every column a JSON list) and the columns-2 file frnccl writes give one summary."""
    job, _ = _truncated_job()
    d = job.write(tmp_path, "compact")
    for path in _files(d):
        packed = summarize(columnar.read_dump(path), path, None)
        _rewrite(path, lambda c, o: None)
        assert json.loads(gzip.decompress(open(path, "rb").read()))["encoding"] == "columns-1"
        with monkeypatch.context() as m:
            _no_rows(m)
            assert summarize(columnar.read_dump(path), path, None) == packed


def test_random_damage_same_outcome(tmp_path, monkeypatch):
    """Values of random columns replaced by values of random types: the same summary or the same problem."""
    job, _ = _truncated_job()
    d = job.write(tmp_path, "compact")
    src = _files(d)[3]
    orig = json.loads(gzip.decompress(open(src, "rb").read()))
    rng = random.Random(7)
    odd = [None, True, 0, -1, 2**70, 1.5, "x", [], [1], {}, {"a": [1]}, [["a", "b"]], ["a", "b", "c"]]
    outcomes = set()
    for i in range(150):
        obj = json.loads(json.dumps(orig))
        cols = obj["entries"]["columns"]
        for _ in range(rng.randint(1, 3)):
            key = rng.choice(sorted(cols))
            col = cols[key]
            if isinstance(col, dict):
                field = rng.choice([f for f in ("table", "delta", "values", "index") if f in col] or ["none"])
                target = col.get(field)
            else:
                target = col
            if isinstance(target, list) and target:
                target[rng.randrange(len(target))] = rng.choice(odd)
            elif isinstance(target, str) and target:  # packed: a character changed, or the text cut
                at = rng.randrange(len(target))
                col[field] = target[:at] + rng.choice(["", "0", "f", "z", " ", "_", "\u00e9"]) + target[at + 1:]
        path = tmp_path / f"frnccl_rank_{i}.json.gz"
        path.write_bytes(gzip.compress(json.dumps(obj).encode()))
        got, want = _both(str(path), monkeypatch)
        assert got == want, (i, got[1], want[1])
        outcomes.add(got[0] is None)
    assert outcomes == {True, False}  # some damage is refused, some is read


def _with_members(path, world, where="pg_config", extra=None):
    """Rewrite a compact dump: the default group's members (or another field's) are ``world`` ranks;
    ``where="two groups"``: another group has a different long list too (as dumps before the members text
    held them)."""
    def fn(cols, obj):
        members = list(range(world))
        for cfg in obj["pg_config"].values():
            cfg.pop("members", None)
        if where in ("pg_config", "two groups"):
            obj["pg_config"]["0"]["global_ranks"] = members
            if where == "two groups":
                other = next(k for k in obj["pg_config"] if k != "0")
                obj["pg_config"][other]["global_ranks"] = list(range(1, 2 * world, 2))
        else:
            obj["elsewhere"] = {"global_ranks": members}
        obj.update(extra or {})
    _rewrite(path, fn)


MEMBER_CASES = {
    "default group": dict(),
    "and a lookalike tag": dict(extra={"note": "\x01frnccl-members-0123456789abcdef-0"}),
    "a list outside pg_config": dict(where="elsewhere"),
    "two long lists": dict(where="two groups"),
}


@pytest.mark.parametrize("case", sorted(MEMBER_CASES))
def test_member_list_parsed_once_same_dump(case, tmp_path, monkeypatch):
    """The default group's member list is parsed once per process (columnar._parse): every dump reads as
    compact.parse reads it, and the summaries are the row path's."""
    from fr_backend.analyzer import columnar as C

    job, _ = synth.mesh_skip(8, 2, steps=3)
    d = job.write(tmp_path, "compact")
    paths = _files(d)
    for p in paths:
        _with_members(p, 3000, **MEMBER_CASES[case])
    seen = []
    for p in paths:
        data = open(p, "rb").read()
        got = C._parse(data)
        assert got == compact.parse(data)
        cfg = got["pg_config"]["0"]
        seen.append(any(cfg.get("global_ranks") is kept for kept in C._members.values()))
        assert summarize(columnar.read_dump(p), p, None) == summarize(load_dump(p), p, None)
    if case == "a list outside pg_config":
        assert not any(seen)
    else:
        assert all(seen)  # one list object for every dump: parsed once


@pytest.mark.parametrize("text", [b'"global_ranks":[1,2,[3]', b'"global_ranks":[' + b"1.5," * 2000 + b"2]",
                                  b'"global_ranks":[' + b"1," * 2000])
def test_member_list_odd_text_same_answer(text, tmp_path):
    """Text that is not a plain list of ints (nested, floats, cut) reads as compact.parse reads it."""
    import gzip as gz

    from fr_backend.analyzer import columnar as C
    from fr_backend.analyzer.model import DumpError

    body = b'{"version":"3.0","pg_config":{"0":{' + text + b'}},"x":1}'
    data = gz.compress(body)
    try:
        want = compact.parse(data)
    except DumpError as exc:
        with pytest.raises(DumpError) as got:
            C._parse(data)
        assert str(got.value) == str(exc)
    else:
        assert C._parse(data) == want


@pytest.mark.parametrize("bad", ["float delta", "text delta", "list delta", "float offset", "text offset",
                                 "offset from a text column"])
def test_non_integer_times_go_the_row_path(bad, tmp_path, monkeypatch):
    """Delta and offset columns that are not integers are never read from columns (compact.columns refuses
    them, or concatenates them): whatever the row path makes of the file is the answer."""
    job, _ = synth.healthy_mesh(8, steps=3)
    d = job.write(tmp_path, "compact")
    path = _files(d)[2]

    def fn(cols, obj):
        n = obj["entries"]["count"]
        if bad.endswith("delta"):
            v = {"float delta": 1.0, "text delta": "1", "list delta": [1]}[bad]
            cols["record_id"] = {"delta": [v] * n}
        elif bad == "offset from a text column":
            cols["time_created_ns"] = ["x"] * n
        else:
            cols["time_discovered_started_ns"] = {"offset_from": "time_created_ns",
                                                  "values": [1.5 if bad == "float offset" else "1"] * n}
    _rewrite(path, fn)
    called = []
    real = columnar._rows
    with monkeypatch.context() as m:
        m.setattr(columnar, "_rows", lambda obj: called.append(1) or real(obj))
        got = _load_one(Candidate(None, [path]))
    assert called  # the row path decided
    with monkeypatch.context() as m:
        m.setattr(load, "read_dump", load_dump)
        assert got == _load_one(Candidate(None, [path]))


def test_index_cache_is_not_shared_with_a_delta_of_the_same_key(tmp_path, monkeypatch):
    """A delta list of -1s read in one file is no proof that a table index of -1s (the same int objects) in another
    file names positions of its table: the row path refuses the second file, and so must the columns."""
    job, _ = synth.mesh_skip(8, 2, steps=3)
    d = job.write(tmp_path, "compact")
    first, second = _files(d)[:2]
    _rewrite(first, lambda c, o: c.__setitem__("frames", {"delta": [-1] * o["entries"]["count"]}))
    _rewrite(second, lambda c, o: c.__setitem__("frames", {"table": c["frames"]["table"],
                                                          "index": [-1] * o["entries"]["count"]}))
    _both(first, monkeypatch)  # the columns read it first: the same process remembers its delta list
    got, want = _both(second, monkeypatch)
    assert want[0] is None and "not a position in its table" in want[1][0].reason
    assert got == want


def test_columns_read_under_the_memory_bound(tmp_path, monkeypatch):
    """A 1 KB file whose delta start is a 4,000-digit integer: each of its 100,000 values is a 1.7 KB integer.
    The row path reads it under the address-space bound (and refuses it); the columns must not build those
    values outside it first."""
    import tracemalloc

    n = 100_000
    obj = {"format": "frnccl", "version": "3.0", "encoding": compact.ENCODING, "pg_config": {},
           "entries": {"count": n, "columns": {
               "time_created_ns": {"delta": "00" * n, "start": 10 ** 4000},
               "time_discovered_started_ns": {"offset_from": "time_created_ns", "values": "00" * n}}}}
    path = tmp_path / "frnccl_rank_0.json.gz"
    path.write_bytes(gzip.compress(json.dumps(obj).encode(), 9))
    assert path.stat().st_size < 2000
    monkeypatch.setattr(dumpfile, "COMPACT_FLOOR", 32 << 20)
    tracemalloc.start()
    try:
        summary, problems = _load_one(Candidate(None, [str(path)]))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert summary is None and "refused" in problems[0].reason, problems
    assert peak < 150 << 20, f"{peak >> 20} MB taken outside the bound for a {path.stat().st_size}-byte file"
def _decoded(obj, keys):
    """The plain values of columns (any form), as compact.to_rows reads them."""
    rows = compact.to_rows(json.loads(json.dumps(obj)))["entries"]
    return [[r.get(k) for r in rows] for k in keys]


def _tabled(vals):
    """Values as a table column of their distinct values (JSON text as the key, as values may be lists)."""
    keys = [json.dumps(v, sort_keys=True) for v in vals]
    order = list(dict.fromkeys(keys))
    return {"table": [json.loads(k) for k in order], "index": [order.index(k) for k in keys]}


def _columns_as(fn, keys):
    def rewrite(cols, obj):
        for k, vals in zip(keys, _decoded(obj, keys)):
            cols[k] = fn(vals)
    return rewrite


def _gpu_times(how):
    def rewrite(cols, obj):
        start, done = _decoded(obj, ("time_discovered_started_ns", "time_discovered_completed_ns"))
        if how == "discovered":
            cols["time_gpu_started_ns"], cols["time_gpu_completed_ns"] = list(start), list(done)
        elif how == "some unknown":
            cols["time_gpu_started_ns"] = [0 if i % 3 == 0 else v for i, v in enumerate(start)]
            cols["time_gpu_completed_ns"] = [None if i % 4 == 1 else v for i, v in enumerate(done)]
        else:  # none known
            cols["time_gpu_started_ns"] = cols["time_gpu_completed_ns"] = [0] * len(start)
    return rewrite


def _retire_unfinished(cols, obj):
    """Every entry retired, finished or not (frnccl: those not completed failed)."""
    cols["retired"] = [True] * obj["entries"]["count"]


def _failed_pair(cols, obj):
    """Two entries in a row retired while started (failed), amid completed ones."""
    (states,) = _decoded(obj, ("state",))
    i = len(states) // 2
    states[i] = states[i + 1] = "started"
    cols["state"], cols["retired"] = _tabled(states), [True] * len(states)


def _seqs_swapped(cols, obj):
    """Two seqs of one group swapped: first and last as usual, the run not contiguous in order."""
    seqs, groups = _decoded(obj, ("collective_seq_id", "process_group"))
    i, j = [k for k in range(len(groups)) if groups[k] == groups[0]][1:3]
    seqs[i], seqs[j] = seqs[j], seqs[i]
    cols["collective_seq_id"] = seqs


def _clock_offset(cols, obj):
    obj["clock"] = {"store_offset_ns": 123_456_789}


# Column forms the columnar reading takes its own steps for: the summary is the row path's all the same.
FORMS = {
    "state and flags as lists": _columns_as(list, ("state", "is_p2p", "retired", "pg_id")),
    "times as tables": _columns_as(_tabled, ("time_created_ns", "time_gpu_started_ns", "record_id", "retired",
                                             "is_p2p", "collective_seq_id")),
    "signature columns each coded apart": _columns_as(lambda vals: _tabled(vals[::-1]) | {
        "index": _tabled(vals[::-1])["index"][::-1]}, ("input_dtypes",)),
    "gpu times the discovered ones": _gpu_times("discovered"),
    "gpu times partly unknown": _gpu_times("some unknown"),
    "gpu times unknown": _gpu_times("none"),
    "unfinished entries retired": _retire_unfinished,
    "clock offset": _clock_offset,
    "failed pair": _failed_pair,
    "seqs swapped": _seqs_swapped,  # not read from columns
}


@pytest.mark.parametrize("shape", ["truncated", "failed", "healthy_mesh"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_column_forms_same_summary(form, shape, tmp_path, monkeypatch):
    job, _ = SHAPES[shape]()
    d = job.write(tmp_path, "compact")
    for path in _files(d):
        _rewrite(path, FORMS[form])
    for path in _files(d):
        want = summarize(load_dump(path), path, None)
        with monkeypatch.context() as m:
            if form != "seqs swapped":
                _no_rows(m)  # read from its columns
            got = summarize(columnar.read_dump(path), path, None)
        assert got == want, path
        assert [len(rp.c_seq) for rp in got.pgs.values()] == [len(rp.c_seq) for rp in want.pgs.values()]
        assert any(len(rp.c_seq) for rp in got.pgs.values())


def test_sizes_equal_in_value_but_not_in_text_same_summary(tmp_path, monkeypatch):
    """A rank's consecutive entries whose sizes are equal as numbers but written differently ([[4]], then
    [[4.0]] or [[true]]): a Sig's sizes are their text, so the columns and the rows must give each entry the
    same Sig either way (the rows took a run of equal rows for one Sig, the columns one Sig per table value)."""
    job = Job(2)
    for _ in range(4):
        job.collective("all_reduce", sizes=[[4]])
    d = job.write(tmp_path, "compact")
    path = _files(d)[1]

    def odd_sizes(cols, obj):
        n = obj["entries"]["count"]
        cols["input_sizes"] = {"table": [[[4]], [[4.0]], [[True]]], "index": [i % 3 for i in range(n)]}

    _rewrite(path, odd_sizes)
    want = summarize(load_dump(path), path, None)
    got = summarize(columnar.read_dump(path), path, None)
    assert got.sigs == want.sigs
    assert got == want


def test_index_cache_is_not_shared_with_a_column_named_after_a_delta(tmp_path, monkeypatch):
    """A table column named "delta record_id" whose index list holds the very objects of record_id's deltas
    (small ints are shared objects), one of them past its table: the row path refuses the file, and so must
    the columns (the cache of checked lists named the two alike)."""
    job = Job(2)
    for _ in range(5):
        job.collective("all_reduce")
    d = job.write(tmp_path, "compact")
    path = _files(d)[0]

    def fn(cols, obj):
        n = obj["entries"]["count"]
        cols["record_id"] = {"delta": [0] + [1] * (n - 1)}
        cols["delta record_id"] = {"table": ["a"], "index": [0] + [1] * (n - 1)}

    _rewrite(path, fn)
    got, want = _both(path, monkeypatch)
    assert want[0] is None and "not a position" in want[1][0].reason
    assert got == want


def test_compact_dump_without_an_entries_key(tmp_path):
    """A compact dump whose entries key is gone (a damaged byte in its name): read without entries or refused
    in one line, by both readers, never an internal error."""
    obj = {"version": "3.0", "format": "frnccl", "encoding": compact.ENCODING, "rank": 0, "world_size": 1,
           "pg_config": {"0": {"name": "0", "desc": "default_pg", "members": "0:1"}}, "pg_status": {}}
    path = tmp_path / "frnccl_rank_0.json.gz"
    path.write_bytes(gzip.compress(json.dumps(obj).encode()))
    for read in (load_dump, columnar.read_dump):
        try:
            got = read(str(path))
        except DumpError as exc:
            assert str(exc) and "\n" not in str(exc)
        else:
            assert not (got.get("entries") if isinstance(got, dict) else None)
