"""backend/PyFrameWalk.hpp against every CPython on this machine.

frnccl reads the calling thread's interpreter frames without the GIL through per-version mirrors of
CPython's internal frame layout (3.11-3.13); the extension checks them against the public frame API once
per process and falls back if they disagree. This test builds a minimal module around the header for each
interpreter it finds (pyenv versions, python3.X on PATH) and checks the walk, taken with the GIL released,
matches the public API frame for frame at several kinds of call site, so a layout slip shows up here
rather than as a silent fallback.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import NamedTuple

import pytest

HERE = Path(__file__).resolve().parent / "frame_walk"
BACKEND = Path(__file__).resolve().parents[1] / "backend"
WALKED = {(3, 11), (3, 12), (3, 13)}


class Interpreter(NamedTuple):
    exe: str
    include: str  # where its Python.h is
    ext_suffix: str  # what its extension modules are called


def interpreters() -> dict[tuple[int, int], Interpreter]:
    found: dict[tuple[int, int], Interpreter] = {}
    candidates = [sys.executable]
    candidates += [str(p) for p in sorted(Path.home().glob(".pyenv/versions/3.*/bin/python3"))]
    candidates += [w for v in range(10, 15) if (w := shutil.which(f"python3.{v}"))]
    for exe in candidates:
        try:
            out = subprocess.run([exe, "-c", "import sys, sysconfig, json; print(json.dumps([sys.version_info[:2], "
                                  "sysconfig.get_paths()['include'], sysconfig.get_config_var('EXT_SUFFIX')]))"],
                                 capture_output=True, text=True, timeout=30)
            version, include, suffix = json.loads(out.stdout)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            continue
        if tuple(version) >= (3, 10) and (Path(include) / "Python.h").exists():
            found.setdefault(tuple(version), Interpreter(exe, include, suffix))
    return found


FOUND = interpreters()


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("version", sorted(FOUND), ids=lambda v: f"py{v[0]}.{v[1]}")
def test_frame_walk_matches_public_api(version, tmp_path):
    python = FOUND[version]
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-std=c++17", f"-I{BACKEND}", f"-I{python.include}",
                    str(HERE / "frame_walk_module.cpp"), "-o", str(tmp_path / f"fw{python.ext_suffix}")],
                   check=True, timeout=120)
    run = subprocess.run([python.exe, str(HERE / "check_frame_walk.py")], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert tuple(result["version"]) == version
    if version in WALKED:
        assert result["agrees"] is True, result
        assert all(isinstance(n, int) and n > 0 for n in result["sites"].values()), result
        assert result["sites"]["deep"] == 64, result  # cut at the frames it was asked for
    else:
        assert result["agrees"] is None and set(result["sites"].values()) == {None}, result


def test_this_interpreter_is_checked():
    assert tuple(sys.version_info[:2]) in FOUND, FOUND
    assert sysconfig.get_paths()["include"]
