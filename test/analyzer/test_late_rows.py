"""The late-arrival rule over wide groups (match._late_rows) reads its rows out of blocks of the columns
(colops.rows): it must give what the plain rule over ``zip(*cols)`` gives, seq for seq."""

import random
from array import array

import pytest

from fr_backend.analyzer import colops, match
from fr_backend.analyzer.match import LateStat


def plain_rule(ranks, cols, seqs, special):
    """The rule as it was written before the columns were read in blocks."""
    late = LateStat()
    mid = (len(ranks) - 1) // 2
    for s, arr in zip(seqs, zip(*cols)):
        if 0 in arr or s in special:
            continue
        mx = max(arr)
        late.n += 1
        late.last.setdefault(ranks[arr.index(mx)], []).append(mx - sorted(arr)[mid])
    return late


def columns(rng, width, n_seqs):
    """Arrivals near 1.7e18 ns with ties (a few distinct values), unknown times (0) and negative ones (a
    shifted clock), one column per rank."""
    base = 1_700_000_000_000_000_000
    cols = []
    for _ in range(width):
        col = [base + rng.choice((0, 5, 5, 1_000, rng.randrange(10**6))) for _ in range(n_seqs)]
        for k in rng.sample(range(n_seqs), n_seqs // 50):
            col[k] = rng.choice((0, -7, -base))
        cols.append(array("q", col))
    return cols


@pytest.mark.parametrize("width", [3, 4, 17, 64])
@pytest.mark.parametrize("block_items", [1, 50, 1 << 21])
def test_late_rows_equals_the_plain_rule(monkeypatch, width, block_items):
    monkeypatch.setattr(colops, "ROWS_BLOCK_ITEMS", block_items)  # rows split across blocks, or one block
    rng = random.Random(width * 1000 + block_items)
    n_seqs = 301
    cols = columns(rng, width, n_seqs)
    ranks = sorted(rng.sample(range(10 * width), width))
    seqs = array("q", range(5, 5 + n_seqs))
    special = set(rng.sample(list(seqs), 20))
    assert [list(r) for r in zip(*cols)] == list(colops.rows(cols))
    want = plain_rule(ranks, cols, seqs, special)
    got = LateStat()
    match._late_rows(ranks, cols, seqs, special, got)
    assert want.n > n_seqs // 2 and len(want.last) > 1, "the case must exercise the rule"
    assert (got.n, got.last) == (want.n, want.last)


def test_rows_of_columns_that_are_not_int64_arrays():
    """Columns of another kind (lists, other typecodes mixed) are read as zip(*cols) reads them."""
    cols = [array("q", [1, 2, 3]), [4, 5, 6], array("i", [7, 8, 9])]
    assert list(colops.rows(cols)) == [[1, 4, 7], [2, 5, 8], [3, 6, 9]]
    assert list(colops.rows([])) == []


@pytest.mark.parametrize("seed", range(6))
def test_late_pairs_equals_the_plain_rule(seed):
    """Pairs take their own path (zeros and seqs set apart looked for in C first): the same as the rule."""
    rng = random.Random(seed)
    n_seqs = 200
    a, b = columns(rng, 2, n_seqs) if seed % 2 else [array("q", [10**18 + rng.randrange(99) for _ in range(n_seqs)])
                                                      for _ in range(2)]
    seqs = array("q", range(1, 1 + n_seqs))
    special = set(rng.sample(range(0, 2 * n_seqs), seed * 4))  # none, or some of them among seqs
    want = plain_rule([3, 9], [a, b], seqs, special)
    got = LateStat()
    match._late_pairs([3, 9], a, b, seqs, special, got)
    assert want.n > n_seqs // 2
    assert (got.n, got.last) == (want.n, want.last)


def test_zero_and_disjoint_checks():
    # 8 zero bytes across two items (1, then 1 << 32, little-endian) are not a zero item
    assert not colops.has_zero(array("q", [1, 1 << 32, 5]))
    assert colops.has_zero(array("q", [1, 0, 5])) and colops.has_zero([4, 0])
    assert not colops.has_zero(array("q")) and not colops.has_zero(array("i", [1, 2]))
    rng = random.Random(7)
    for _ in range(200):
        seqs = array("q", sorted(rng.sample(range(100), rng.randrange(0, 30))))
        special = set(rng.sample(range(-5, 105), rng.randrange(0, 40)))
        assert match._disjoint(special, seqs) == special.isdisjoint(seqs), (special, seqs)
