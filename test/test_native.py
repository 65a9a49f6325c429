"""The CMake build of the core (find_package(Torch)) compiles and its C++ tests pass."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils import cpp_extension

ROOT = Path(__file__).resolve().parents[1]


def _refuses_cuda_toolkit(output: str) -> str:
    """The line where torch's CMake config gave up on the CUDA toolkit (none, or one without NVRTC), or ""."""
    for line in output.splitlines():
        if re.search(r"CUDA|nvrtc|NVRTC|cudart", line) and re.search(r"not found|NOT found|Could not|Could NOT|"
                                                                    r"missing|no such|failed", line, re.I):
            return line.strip()
    return ""


@pytest.mark.timeout(1200)
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_cmake_build_and_ctest(tmp_path):
    build = tmp_path / "build-native"
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    # Against a CUDA torch, the toolkit setup.py builds with: torch's CMake config otherwise looks
    # next to the first nvcc on PATH, which may be a wrapper outside the toolkit.
    cuda_home = cpp_extension.CUDA_HOME if torch.version.cuda else None
    toolkit = [f"-DCUDA_TOOLKIT_ROOT_DIR={cuda_home}"] if cuda_home else []
    configure = subprocess.run(
        ["cmake", "-S", str(ROOT), "-B", str(build), *generator,
         f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", f"-DPython3_EXECUTABLE={sys.executable}", *toolkit],
        capture_output=True, text=True, timeout=300, env=env)
    if configure.returncode != 0 and torch.version.cuda and _refuses_cuda_toolkit(configure.stdout + configure.stderr):
        pytest.skip("torch's CMake config for a CUDA build of torch refuses this machine's CUDA toolkit: "
                    + _refuses_cuda_toolkit(configure.stdout + configure.stderr))
    assert configure.returncode == 0, configure.stdout[-3000:] + configure.stderr[-3000:]
    compiled = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True, timeout=1000, env=env)
    assert compiled.returncode == 0, compiled.stdout[-3000:] + compiled.stderr[-3000:]
    tested = subprocess.run(["ctest", "--test-dir", str(build), "--output-on-failure"],
                            capture_output=True, text=True, timeout=120)
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-3000:]
    assert "100% tests passed" in tested.stdout
