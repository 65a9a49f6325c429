"""Work over columns of machine ints (array("q"): a rank's times per slot) done in C where the stdlib can:
reading an item of an array makes an int object, and at 16,384 ranks x 1,500 seqs that is 25 M of them."""

from __future__ import annotations

from array import array
from collections.abc import Iterator

__all__ = ["ROWS_BLOCK_ITEMS", "has_zero", "rows"]

ROWS_BLOCK_ITEMS = 1 << 21  # 16 MiB of int64 per block of rows


def rows(cols: list[array]) -> Iterator[list[int]]:
    """The rows of equal-length int64 columns, each as a list: what ``zip(*cols)`` gives, without a call per
    item through one iterator per column (at 16,384 ranks x 1,500 seqs, 25 M of them, 3 s). A block of
    rows is copied column after column into one buffer, in C, and each row copied out of it through a strided
    view; a block holds at most ROWS_BLOCK_ITEMS items."""
    if not cols:
        return
    if any(type(c) is not array or c.typecode != cols[0].typecode for c in cols):
        yield from map(list, zip(*cols))
        return
    n = len(cols[0])
    code = cols[0].typecode
    step = max(1, ROWS_BLOCK_ITEMS // len(cols))
    views = [memoryview(c) for c in cols]
    for b in range(0, n, step):
        e = min(n, b + step)
        w = e - b
        block = memoryview(b"".join([v[b:e] for v in views])).cast(views[0].format)
        for k in range(w):  # a row copied out whole, then boxed: faster than boxing through the strided view
            yield array(code, block[k::w].tobytes()).tolist()


_ZERO64 = bytes(8)


def has_zero(col: object) -> bool:
    """``0 in col``; for an int64 array, first looked for as 8 zero bytes in C, without boxing each item (a
    run of 8 zero bytes across two items is confirmed item by item)."""
    if type(col) is array and col.itemsize == 8 and _ZERO64 not in col.tobytes():  # type: ignore[attr-defined]
        return False
    return 0 in col  # type: ignore[operator]
