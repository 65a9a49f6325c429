"""HTML report: self-contained, culprit highlighted, renders in headless Chromium."""

import os
import re
import shutil
import struct
import subprocess
import tempfile

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


def _png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium not installed")
def test_html_screenshot(tmp_path):
    a = analyse(hang_job(), tmp_path)
    html_path = tmp_path / "report.html"
    write_html(a, str(html_path))
    shot = os.environ.get("FRNCCL_SCREENSHOT") or str(tmp_path / "report.png")
    with tempfile.TemporaryDirectory() as profile:
        p = subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1200,1400",
             f"file://{html_path}"], capture_output=True, text=True, timeout=120)
    assert os.path.exists(shot), p.stderr[-2000:]
    w, h = _png_size(shot)
    assert (w, h) == (1200, 1400)
    # the page is not blank: the PNG of a rendered grid compresses far worse than an empty page
    assert os.path.getsize(shot) > 20_000
