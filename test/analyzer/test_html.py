"""HTML report: self-contained, culprit highlighted, renders in headless Chromium."""

import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import zlib

import pytest
from conftest import analyse

from fr_backend.analyzer.html import render, write_html
from fr_backend.analyzer.synth import Job


def hang_job() -> Job:
    j = Job(8)
    tp = j.new_pg("1", [4, 5], "tp")
    for _ in range(6):
        j.collective()
        j.collective(pg=tp)
    j.collective(sizes_by_rank={6: [[2, 2]]}, out_sizes_by_rank={6: [[2, 2]]})
    j.collective(ranks=[0, 1, 2, 4, 5, 6, 7], state="started")
    j.set_stacks(3, 'Thread 0x7f01 (most recent call first):\n  File "train.py", line 88 in load_batch\n')
    return j


def test_html_is_self_contained_and_marks_culprit(tmp_path):
    a = analyse(hang_job(), tmp_path)
    page = render(a)
    assert not re.search(r"(src|href)\s*=\s*['\"]?(https?:)?//", page)
    assert "<script" not in page and "@import" not in page and "url(" not in page
    assert "Root cause: rank 3" in page
    assert page.count("<tr class='cul'><th>rank 3 (culprit)</th>") == 1  # only in the default pg grid
    assert "class='nj'" in page  # the seq rank 3 never issued
    assert "class='c mm'" in page  # the completed size mismatch of rank 6
    assert "load_batch" in page
    m = re.search(r"<td class='s' title='([^']*)'", page)
    assert m and "rank 0 | pg 0 (default_pg) | seq 8" in m.group(1) and "state: started" in m.group(1)


def test_html_healthy(tmp_path):
    j = Job(4)
    for _ in range(3):
        j.collective()
    page = render(analyse(j, tmp_path))
    assert "No problems found" in page and "class='cul'" not in page


CHROMIUM = shutil.which("chromium")
# Headless, nothing of the browser's own beyond the page: a fresh profile per run; names resolve to nothing
# (the browser's own background requests never leave the machine) but 127.0.0.1, where the control page's
# probe goes.
HEADLESS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]
RED, ROOT_BG, COMPLETED = (0xC6, 0x28, 0x28), (0xFF, 0xF5, 0xF5), (0x66, 0xBB, 0x6A)  # html.CSS's colours


def _chromium(page, *args: str) -> tuple[str, list[str]]:
    """Chromium's output for ``page`` (a file), and the URLs the page itself asked the network for."""
    with tempfile.TemporaryDirectory() as tmp:
        netlog = os.path.join(tmp, "net.json")
        p = subprocess.run([CHROMIUM, *HEADLESS, f"--user-data-dir={tmp}/profile", f"--log-net-log={netlog}", *args,
                            f"file://{page}"], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        with open(netlog) as f:
            log = json.load(f)
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    # The browser's own requests (updates, time, accounts) have no origin; a page's carry the page's ("null"
    # for a file).
    asked = [e["params"]["url"] for e in log["events"] if e["type"] == start and "url" in e.get("params", {})
             and e["params"].get("initiator") != "not an origin"]
    return p.stdout, asked


def _read_png(path) -> tuple[int, int, list[list[tuple[int, ...]]]]:
    """(width, height, rows of RGB pixels) of an 8-bit, non-interlaced RGB or RGBA PNG, as Chromium writes it."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", data[pos + 8:pos + 8 + n])
        elif kind == b"IDAT":
            idat.append(data[pos + 8:pos + 8 + n])
        pos += 12 + n
    assert ihdr is not None
    w, h, depth, color, _, _, interlace = ihdr
    assert depth == 8 and color in (2, 6) and interlace == 0, ihdr
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(b"".join(idat)), w * bpp
    prev, rows = bytearray(stride), []
    for y in range(h):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if kind == 1:  # sub
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif kind == 2:  # up
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif kind == 3:  # average
            for i in range(stride):
                line[i] = (line[i] + (((line[i - bpp] if i >= bpp else 0) + prev[i]) >> 1)) & 255
        elif kind == 4:  # paeth
            for i in range(stride):
                a, b, c = (line[i - bpp], prev[i], prev[i - bpp]) if i >= bpp else (0, prev[i], 0)
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x:x + 3]) for x in range(0, stride, bpp)])
        prev = line
    return w, h, rows


def _spans(rows: list[list[tuple[int, ...]]], colour: tuple[int, int, int], x0: int = 0,
           x1: int | None = None) -> list[tuple[int, int, int, int]]:
    """(y, first x, last x, pixels) of every pixel row with pixels of ``colour`` between x0 and x1."""
    out = []
    for y, row in enumerate(rows):
        xs = [x for x, px in enumerate(row[x0:x1], x0) if px == colour]
        if xs:
            out.append((y, xs[0], xs[-1], len(xs)))
    return out


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")
def test_html_in_chromium_shows_the_culprit_without_scripts_or_network(tmp_path):
    """The report in a real browser: the root-cause box and rank 3's culprit row are on the screen, from the
    page alone (no script, no request to the network). A control page's request shows the check can see one."""
    control = tmp_path / "control.html"
    control.write_text("<!DOCTYPE html><html><body><img src='http://127.0.0.1:9/probe.png'></body></html>")
    assert _chromium(control, "--dump-dom")[1] == ["http://127.0.0.1:9/probe.png"]

    html_path = tmp_path / "report.html"
    write_html(analyse(hang_job(), tmp_path), str(html_path))
    dom, asked = _chromium(html_path, "--dump-dom")
    assert asked == []
    # the DOM as laid out: no script element, no event handler; findings first, the culprit's row in the grid
    assert "<script" not in dom and not re.search(r"\son[a-z]+=", dom)
    assert re.search(r"<div class=\"root\"><b class=\"k\">Root cause: rank 3</b>", dom)
    assert re.findall(r"<tr class=\"cul\"><th>(rank \d+) \(culprit\)</th>", dom) == ["rank 3", "rank 6"]
    assert dom.index("Root cause") < dom.index("<table")

    shot = os.environ.get("FRNCCL_SCREENSHOT") or str(tmp_path / "report.png")
    _, asked = _chromium(html_path, f"--screenshot={shot}", "--window-size=1200,1400")
    assert asked == []
    w, h, rows = _read_png(shot)
    assert (w, h) == (1200, 1400)
    # The root-cause box: its background across most of the page's width, on many pixel rows, at the top.
    box = [y for y, _, _, n in _spans(rows, ROOT_BG) if n > w // 2]
    assert len(box) >= 20 and box[0] < h // 4, box[:3]
    # The grids: pixel rows of at least a few completed cells (the legend's one square is not), below the box.
    grid = [g for g in _spans(rows, COMPLETED) if g[3] >= 40]
    assert grid and grid[0][0] > box[-1], (grid[:1], box[-1:])
    top, bottom = grid[0][0], grid[-1][0]
    left, right = min(g[1] for g in grid), max(g[2] for g in grid)
    # Across the cells, the culprit rows' red borders: as much red as a row's completed cells have green,
    # where only one cell's outline (the seq rank 3 never issued) would be red if the rows were not marked.
    cells = max(g[3] for g in grid)
    red = [y for y, _, _, n in _spans(rows[top:bottom + 1], RED, left, right + 1) if n >= 0.8 * cells]
    lines = sum(1 for a, b in zip([-2] + red, red) if b != a + 1)
    assert lines == 4, (red, top, bottom, left, right)  # above and below each of the two culprits' rows
