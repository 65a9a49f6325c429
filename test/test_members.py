"""A group's members are written once, as runs (pg_config "members"): the C++ writer's text
(backend/CompactEncoding.cpp, compiled alone with a small driver) is what members.py reads and writes, a
100,000-rank group is a few bytes, torch's ranks string comes back whole, and a hostile text is one clear
refusal."""

from __future__ import annotations

import random
import subprocess
import time

import pytest

import encoding_driver
from fr_backend import members


DRIVER = r"""
#include <cstdint>
#include <iostream>
#include "CompactEncoding.hpp"
using namespace frnccl;
// stdin: lines of "<count> <rank>...": for each, the members text and torch's ranks string made from it
int main() {
  size_t n = 0;
  while (std::cin >> n) {
    std::vector<int64_t> ranks(n);
    for (auto& r : ranks) {
      std::cin >> r;
    }
    const std::string text = CompactEncoding::members(ranks);
    std::cout << text << "\n" << CompactEncoding::torchRanks(text) << "\n";
  }
}
"""

rng = random.Random(38)
CASES = {
    "world 100000": list(range(100_000)),
    "dp of tp8 at 100000": list(range(5, 100_000, 8)),
    "tp block": list(range(99_984, 99_992)),
    "split, descending": list(range(99_999, -1, -7)),
    "explicit": [7, 3, 12, 5],
    "pairs": [0, 1, 5, 6, 7, 9],
    "permuted": rng.sample(range(4096), 1000),
    "one": [42],
    "none": [],
    "int64 edges": [-(2**63), 0, 2**63 - 1],
}


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return encoding_driver.build(tmp_path_factory.mktemp("members_driver"), DRIVER)


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpp_members_text_reads_back(driver, name):
    ranks = CASES[name]
    out = subprocess.run([str(driver)], input=f"{len(ranks)} {' '.join(map(str, ranks))}\n", capture_output=True,
                         text=True, check=True, timeout=60).stdout
    text, torch_ranks = out.split("\n")[:2]
    assert text == members.encode(ranks)  # one encoding, C++ and Python
    assert members.decode(text, 1 << 64) == ranks
    assert torch_ranks == str(ranks)  # what torch's fr_trace reads in the pickle
    if name in ("world 100000", "dp of tp8 at 100000", "split, descending", "tp block"):
        assert len(text) <= 20, text  # one run, whatever the world size


@pytest.mark.parametrize("text, why", [
    ("0:9999999999", "names more than"), ("0:100:0", "step 0"), ("1:2:3:4", "not a run"), ("x", "not a rank"),
    ("1,,2", "not a rank"), ("0:\u0661\u0662", "not a rank"), (" 1", "not a rank"), ("9" * 40, "not a rank"),
    ("0:600000,0:600000", "names more than"),
])
def test_hostile_members_text_refused_at_once(text, why):
    t = time.perf_counter()
    with pytest.raises(members.MembersError, match=why):
        members.decode(text, 1 << 20)
    assert time.perf_counter() - t < 1.0  # counted, never expanded


def test_members_text_is_one_shared_tuple_per_process(tmp_path):
    """Every dump holding the same members text gets the same member tuple (decoded once), and a bad text
    refuses that dump with one line."""
    from fr_backend.analyzer import header
    from fr_backend.analyzer.model import DumpError

    a = header._members({"members": "0:100000"})
    b = header._members({"members": "0:100000"})
    assert a is b and a == tuple(range(100_000))
    assert header._members({"members": "5:100005:8", "global_ranks": [1, 2]}) == tuple(range(5, 100_000, 8))
    assert header._members({"global_ranks": [3, 1, 2], "ranks": "[3, 1, 2]"}) == (1, 2, 3)  # older dumps
    with pytest.raises(DumpError, match="pg_config members: 'zz' is not a rank"):
        header._members({"members": "zz"})


def test_distinct_long_texts_do_not_pile_up():
    """Files that each bring a new long members text: what is kept stays within its bound."""
    from fr_backend.analyzer import header

    for k in range(12):
        got = header._members({"members": f"{k}:{k + 900_000}"})
        assert len(got) == 900_000
        assert header._MEMBERS_HELD <= header._MEMBERS_HELD_MAX
        assert sum(map(len, header._MEMBERS_BY_TEXT.values())) == header._MEMBERS_HELD
