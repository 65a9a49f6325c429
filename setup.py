"""Builds fr_backend and its C++ extension against the torch already installed.

Install with `pip install --no-build-isolation .`: an isolated build would
install a fresh torch (a CUDA build of several GB) just to compile against it.
"""

from __future__ import annotations

import glob
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field

from setuptools import find_packages, setup

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:  # pragma: no cover - exercised only on a broken install
    sys.exit(
        "frnccl: torch must be installed before building; run "
        "`pip install torch==2.13.0` first, then `pip install --no-build-isolation .`"
    )

HERE = os.path.dirname(os.path.abspath(__file__))
BACKEND = os.path.join("backend")
CUDA_ONLY = {os.path.join(BACKEND, "CudaMarker.cpp"), os.path.join(BACKEND, "NcclProgress.cpp")}
CPU_ONLY = {os.path.join(BACKEND, "NoCuda.cpp")}


@dataclass
class CudaRuntime:
    """Where the CUDA runtime's headers and library are, or why the CUDA parts are not built."""

    include_dirs: list[str] = field(default_factory=list)
    link_args: list[str] = field(default_factory=list)
    skipped: str = ""  # non-empty: the one-line reason the build has no CUDA parts


def _site_dirs() -> list[str]:
    return [d for d in dict.fromkeys(sys.path) if d and os.path.isdir(d)]


def _header_dirs() -> list[str]:
    """Folders of CUDA headers, the `nvidia` wheels' first (cu13: nvidia/cu13, cu12: nvidia/cuda_runtime,
    nvidia/cublas, ...: the versions torch was built with and loads), then a toolkit's. torch's own CUDA
    headers need the runtime's and the math libraries' (cusparse.h, cublas_v2.h); the runtime's include
    the compiler's crt/ headers, which come with a toolkit or the nvidia-cuda-crt wheel."""
    dirs = []
    for site in _site_dirs():
        dirs += sorted(glob.glob(os.path.join(site, "nvidia", "*", "include")))
    dirs += [os.path.join(home, "include") for home in (cpp_extension.CUDA_HOME, "/usr/local/cuda") if home]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def _cudart(include_dir: str, major: str) -> list[str]:
    """Link arguments for the CUDA runtime beside `include_dir` (wheels ship only libcudart.so.N, which
    `-lcudart` does not find), or [] if it is not there. Only torch's major version (libcudart.so.<major>):
    torch loads that soname before frnccl does, and two runtimes in one process do not share streams."""
    for lib in ("lib64", "lib"):
        folder = os.path.join(os.path.dirname(include_dir), lib)
        versioned = os.path.join(folder, f"libcudart.so.{major}")
        if os.path.isfile(os.path.join(folder, "libcudart.so")) and os.path.isfile(versioned):
            return [f"-L{folder}", "-lcudart"]
        if os.path.isfile(versioned):
            return [versioned]
    return []


def _runtime_major(include_dir: str) -> str:
    """The CUDA major version of the runtime headers in `include_dir` (CUDART_VERSION 13020 -> "13"), or ""."""
    try:
        with open(os.path.join(include_dir, "cuda_runtime_api.h"), encoding="utf-8", errors="replace") as f:
            for line in f:
                words = line.split()
                if len(words) == 3 and words[:2] == ["#define", "CUDART_VERSION"] and words[2].isdigit():
                    return str(int(words[2]) // 1000)
    except OSError:
        pass
    return ""


def _cuda_runtime() -> CudaRuntime:
    if torch.version.cuda is None:
        return CudaRuntime(skipped="torch is a CPU build")
    if os.environ.get("FRNCCL_BUILD_CUDA") == "0":
        return CudaRuntime(skipped="FRNCCL_BUILD_CUDA=0")
    major = str(torch.version.cuda).split(".")[0]
    # Headers of another CUDA major (cu12 wheels beside cu13 ones) are left out.
    dirs = [d for d in _header_dirs()
            if not os.path.isfile(os.path.join(d, "cuda_runtime_api.h")) or _runtime_major(d) == major]
    api = next((d for d in dirs if os.path.isfile(os.path.join(d, "cuda_runtime_api.h"))), None)
    if api is None:
        return CudaRuntime(skipped=f"cuda_runtime_api.h of CUDA {major} not found (no CUDA toolkit, no "
                                   "nvidia-cuda-runtime wheel)")
    if not any(os.path.isfile(os.path.join(d, "crt", "host_defines.h")) for d in dirs):
        return CudaRuntime(skipped=f"crt/host_defines.h not found beside {api} (pip install nvidia-cuda-crt)")
    link = _cudart(api, major)
    if not link:
        return CudaRuntime(skipped=f"libcudart not found beside {api}")
    missing = _cuda_headers_missing(dirs)
    if missing:
        return CudaRuntime(skipped=f"torch's CUDA headers do not compile here: {missing}")
    return CudaRuntime(include_dirs=dirs, link_args=link)


def _cuda_headers_missing(dirs: list[str]) -> str:
    """The compiler's first error on torch's CUDA headers with `dirs`, or "" when they compile.

    A partial toolkit or a wheel set without a math library's headers (torch's ATen/cuda headers include
    cusparse.h and cublas) would otherwise fail the whole build halfway; this costs a few seconds."""
    probe = "#include <c10/cuda/CUDAStream.h>\n#include <ATen/cuda/CUDAContext.h>\n"
    includes = [f"-I{d}" for d in cpp_extension.include_paths() + dirs]
    cmd = [*shlex.split(os.environ.get("CXX") or "c++"), "-std=c++20", "-fsyntax-only", "-x", "c++", "-", *includes]
    try:
        done = subprocess.run(cmd, input=probe, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{cmd[0]}: {err}"
    if done.returncode == 0:
        return ""
    errors = [ln.strip() for ln in done.stderr.splitlines() if "error" in ln]
    return (errors or [f"{cmd[0]} exited with {done.returncode}"])[0]


def _nccl_include_dir() -> str | None:
    """Where nccl.h is, for torch's ProcessGroupNCCL.hpp (backend/NcclProgress.cpp), or None.

    The NCCL that torch's wheel depends on comes first: it is the one torch loads.
    """
    if os.environ.get("FRNCCL_SETTLE_BY_TORCH_WATCHDOG_BUILD") == "0":
        return None
    candidates = [os.environ.get("NCCL_INCLUDE_DIR", "")]
    for site in sys.path:
        candidates.append(os.path.join(site, "nvidia", "nccl", "include"))
    candidates += [os.path.join(cpp_extension.CUDA_HOME or "", "include"), "/usr/include", "/usr/local/include"]
    for directory in candidates:
        if directory and os.path.isfile(os.path.join(directory, "nccl.h")):
            return directory
    return None


def _extension():
    cuda = _cuda_runtime()
    sources = sorted(glob.glob(os.path.join(BACKEND, "*.cpp")))
    drop = CUDA_ONLY if cuda.skipped else CPU_ONLY
    sources = [s for s in sources if s not in drop]
    kwargs = dict(
        name="fr_backend._C",
        sources=sources,
        include_dirs=[os.path.join(HERE, BACKEND), os.path.join(HERE, "python", "fr_backend")],
        extra_compile_args={"cxx": ["-O2", "-fvisibility=hidden"]},
    )
    if cuda.skipped:
        if torch.version.cuda is not None:
            print(f"frnccl: building without the CUDA parts: {cuda.skipped}; synchronous NCCL ops will not be "
                  "followed to completion (`frnccl config` says so)", file=sys.stderr)
        note = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "'" for c in cuda.skipped)
        kwargs["define_macros"] = [("FRNCCL_CUDA_SKIPPED", f'"{note}"')]
        return cpp_extension.CppExtension(**kwargs)
    # A C++ extension with the runtime found by hand, not CUDAExtension: frnccl compiles no .cu file, and
    # CUDAExtension wants a whole toolkit (`-lcudart`, CUDA_HOME/lib64) that pip-installed CUDA torch lacks.
    kwargs["define_macros"] = [("FRNCCL_WITH_CUDA", "1")]
    kwargs["include_dirs"] += cuda.include_dirs
    kwargs["libraries"] = ["c10_cuda", "torch_cuda"]
    kwargs["extra_link_args"] = cuda.link_args
    nccl_include = _nccl_include_dir()
    if nccl_include is None:
        print("frnccl: nccl.h not found (set NCCL_INCLUDE_DIR): synchronous NCCL ops will each get an end event")
    else:
        kwargs["define_macros"].append(("FRNCCL_WITH_NCCL_HEADERS", "1"))
        kwargs["include_dirs"].append(nccl_include)
    return cpp_extension.CppExtension(**kwargs)

setup(
    name="frnccl",
    version="0.1.0",
    description="A flight-recording torch.distributed backend: every rank dumps its recent collectives when a job hangs",
    package_dir={"": "python"},
    packages=find_packages("python"),
    package_data={"fr_backend": ["dump_keys.def"]},
    python_requires=">=3.10",
    # FRNCCL_METRICS_PORT / FRNCCL_METRICS_DIR: pip install frnccl[metrics]
    extras_require={"metrics": ["prometheus_client>=0.16"]},
    ext_modules=[_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
    entry_points={
        "torch.backends": ["frnccl = fr_backend._autoload:load"],
        "console_scripts": ["frnccl = fr_backend.cli:main"],
    },
    zip_safe=False,
)
