"""How the loader's workers hand each summary to the analyzer (analyzer/workers.py): one frame per answer,
read into one buffer that grows to the largest answer, in the candidates' order whatever their sizes."""

import os
import pickle
import signal
import sys
from dataclasses import dataclass, field

import pytest

from fr_backend.analyzer import workers
from fr_backend.analyzer.model import LoadProblem, RankSummary

pytestmark = pytest.mark.skipif(not workers.available(), reason="workers need fork")


@dataclass
class Cand:
    rank_hint: int | None
    paths: list[str] = field(default_factory=list)


STACKS = {0: 10, 1: 300_000, 2: 3_000_000, 3: 50, 4: 200_000, 5: 0}  # bytes of thread stacks per rank


def read_path(path, hint):
    if path.endswith(".bad"):
        return None, LoadProblem(path, "not a dump")
    return RankSummary(rank=hint, path=path, fmt="frnccl", version="1", thread_stacks="s" * STACKS[hint]), None


def test_answers_larger_than_the_buffer_come_back_whole_and_in_order(tmp_path):
    """Summaries from 10 B to 3 MB (the buffer starts at 128 KiB), from two workers, a file refused among
    them and a rank with a second path after a bad one: each comes back equal, in the candidates' order."""
    cands = [Cand(r, [str(tmp_path / f"r{r}")]) for r in STACKS]
    cands[3].paths.insert(0, str(tmp_path / "r3.bad"))
    cands.append(Cand(6, [str(tmp_path / "r6.bad")]))
    got = list(workers.read_isolated(cands, 2, read_path))
    assert len(got) == len(cands)
    for r, (summary, problems) in zip(STACKS, got):
        assert summary is not None and summary.rank == r and summary.thread_stacks == "s" * STACKS[r]
        assert summary.path == str(tmp_path / f"r{r}")
        assert problems == ([LoadProblem(str(tmp_path / "r3.bad"), "not a dump")] if r == 3 else [])
    assert got[-1] == (None, [LoadProblem(str(tmp_path / "r6.bad"), "not a dump")])


def test_reader_takes_the_64_bit_length_and_says_eof():
    """A frame past 2 GiB carries -1 and a 64-bit length (as multiprocessing writes it): the reader takes
    that form (shown here on a small body); a pipe closed mid-frame is EOFError, never a partial answer."""
    r, w = os.pipe()
    try:
        body = pickle.dumps((7, "x" * 1000, None))
        os.write(w, workers._HEAD.pack(-1) + workers._HEAD64.pack(len(body)) + body)
        os.write(w, workers._frame(pickle.dumps("next")))
        os.write(w, workers._HEAD.pack(100) + b"only part of it")
        os.close(w)  # all written first: a reader that misreads a length meets EOF, it does not wait
        reader = workers._Reader()
        assert reader.recv(r) == (7, "x" * 1000, None)
        assert reader.recv(r) == "next"
        with pytest.raises(EOFError):
            reader.recv(r)
    finally:
        os.close(r)


@pytest.mark.parametrize("jobs", [1, 2])
def test_second_path_of_a_workers_last_file_is_read(tmp_path, jobs):
    """The last file in flight on a worker is refused and its rank has another path (a damaged compact dump,
    its pickle beside it): the worker is handed that path while it still waits for answers. Each rank comes
    back, with the refused file named; the analysis is not stopped."""
    cands = [Cand(r, [str(tmp_path / f"r{r}")]) for r in range(jobs)]
    cands[-1].paths.insert(0, str(tmp_path / f"r{jobs - 1}.bad"))
    got = list(workers.read_isolated(cands, jobs, read_path))
    assert [s.rank for s, _ in got] == list(range(jobs))
    assert got[-1][1] == [LoadProblem(str(tmp_path / f"r{jobs - 1}.bad"), "not a dump")]


def test_damaged_compact_dump_falls_back_to_its_pickle_in_workers(tmp_path):
    """An incident with compact and pickle dumps, one compact file damaged: read in workers (as the command
    line reads), that rank is taken from its pickle and the damaged file named."""
    from fr_backend.analyzer import synth
    from fr_backend.analyzer.report import run

    job, _ = synth.healthy_mesh(2, steps=3)
    inc = job.write(tmp_path, "compact")
    job.write(tmp_path, "pickle")
    bad = os.path.join(inc, "compact", "frnccl_rank_1.json.gz")
    with open(bad, "wb") as f:
        f.write(b"\x1f\x8b damaged")
    a = run([inc], jobs=1, isolate=True)
    assert sorted(a.res.ranks) == [0, 1]
    assert a.res.ranks[1].path == os.path.join(inc, "pickle", "frnccl_rank_1")
    assert [p.path for p in a.res.problems] == [bad]


def bomb(depth):
    x = ["x"]
    for _ in range(depth):
        x = [x, x]
    return x


def bombed_summary(path, hint):
    """Rank 1's summary holds 2**40 shared values (a reduction that kept a raw value by reference)."""
    return RankSummary(rank=hint, path=path, fmt="frnccl", version="1", notes=bomb(40) if hint == 1 else []), None


def test_a_summary_that_unfolds_far_past_its_pickle_is_refused(tmp_path):
    """The parent follows each summary as a tree: one whose shared values unfold far past its pickle is refused
    in the worker, by name, and the other ranks come back."""
    cands = [Cand(r, [str(tmp_path / f"r{r}")]) for r in range(3)]
    got = list(workers.read_isolated(cands, 2, bombed_summary))
    ranks = [s.rank if s else None for s, _ in got]
    assert ranks == [0, None, 2], ranks  # never `got` in a message: a bomb that came back would be printed
    (problem,) = got[1][1]
    assert problem.path == cands[1].paths[0] and "pickle bomb" in problem.reason, problem


def measured_read(path, hint):
    """Says whether this read measures the raw tree (dumpfile._MEASURE_TREE): in the summary, or in the problem of
    a '.bad' file. On a read that does not measure, a '.xcpu' file ends its worker as the CPU limit does, a '.oom'
    file as the kernel's OOM killer does."""
    from fr_backend.analyzer import dumpfile

    measured = dumpfile._MEASURE_TREE
    if path.endswith(".bad"):
        return None, LoadProblem(path, f"not a dump (measured={measured})")
    if not measured and path.endswith((".xcpu", ".oom")):
        os.kill(os.getpid(), signal.SIGXCPU if path.endswith(".xcpu") else signal.SIGKILL)
    return RankSummary(rank=hint, path=path, fmt="frnccl", version="1", thread_stacks=f"measured={measured}"), None


def _address_space_room() -> bool:
    """Whether a worker can bound its address space here: Linux's RLIMIT_AS, not already set low (ulimit -v)."""
    if not sys.platform.startswith("linux"):
        return False
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return soft == resource.RLIM_INFINITY or soft > 8 << 30


@pytest.mark.skipif(not _address_space_room(), reason="needs RLIMIT_AS to bound a worker's address space")
def test_first_read_does_not_measure_and_a_pickle_it_fails_is_read_again_measured(tmp_path):
    """A pickle is read once, without bounds.check on its entries; a pickle that this read refuses, or that runs
    out of its CPU allowance, is read again with the check, and that read's answer is the file's. A worker killed
    otherwise (the OOM killer) is not tried again. Anything but a pickle is measured on its only read."""
    names = ["r0", "r1.bad", "r2.xcpu", "r3", "r4.oom", "r5"]
    for name in names:
        (tmp_path / name).write_bytes(b"\x80" if name != "r5" else b"{}")  # r5: not a pickle
    cands = [Cand(r, [str(tmp_path / name)]) for r, name in enumerate(names)]
    got = list(workers.read_isolated(cands, 2, measured_read))
    stacks = [s.thread_stacks if s else None for s, _ in got]
    assert stacks == ["measured=False", None, "measured=True", "measured=False", None, "measured=True"], got
    assert got[1][1] == [LoadProblem(cands[1].paths[0], "not a dump (measured=True)")], got[1]
    (oom,) = got[4][1]
    assert "killed by SIGKILL" in oom.reason, oom


def many_groups(path, hint):
    """A rank in 100 groups with 1,000 distinct op signatures: every group refers to the rank's one table."""
    from fr_backend.analyzer.model import RankPg

    s = RankSummary(rank=hint, path=path, fmt="frnccl", version="1")
    s.sigs.extend(("all_gather", "all_gather", f"[[{i}, 4096]]" * 8, "Float", 1) for i in range(1000))
    for g in range(100):
        s.pgs[str(g)] = RankPg(name=str(g), desc="", ranks=(0, 1), sigs=s.sigs)
    return s, None


def test_a_rank_in_many_groups_is_not_taken_for_a_bomb(tmp_path):
    """The summary's measure counts the signature table once, not once per group that refers to it: an honest
    rank in 100 groups comes back, with its groups still sharing the one table."""
    cands = [Cand(r, [str(tmp_path / f"r{r}")]) for r in range(2)]
    got = list(workers.read_isolated(cands, 2, many_groups))
    assert [(s.rank if s else None, [p.reason for p in ps]) for s, ps in got] == [(0, []), (1, [])]
    s = got[0][0]
    assert len(s.sigs) == 1000 and all(rp.sigs is s.sigs for rp in s.pgs.values())
