"""The C++ dump encoding (backend/CompactEncoding.cpp, DumpValue.cpp) compiled alone with a small driver, so a
test feeds it values and reads its text without building the extension."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def build(folder: Path, source: str) -> Path:
    """The driver ``source`` (a main() using CompactEncoding) compiled in ``folder``; skips without a compiler."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    (folder / "driver.cpp").write_text(source)
    exe = folder / "driver"
    subprocess.run([cxx, "-std=c++17", "-O1", f"-I{ROOT / 'backend'}", f"-I{ROOT / 'python' / 'fr_backend'}",
                    str(folder / "driver.cpp"), str(ROOT / "backend" / "CompactEncoding.cpp"),
                    str(ROOT / "backend" / "DumpValue.cpp"), "-o", str(exe)], check=True, timeout=300)
    return exe
