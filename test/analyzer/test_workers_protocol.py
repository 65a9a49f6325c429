"""How the loader's workers hand each summary to the analyzer (analyzer/workers.py): one frame per answer,
read into one buffer that grows to the largest answer, in the candidates' order whatever their sizes."""

import os
import pickle
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
