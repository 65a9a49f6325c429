"""Builds fr_backend and its C++ extension against the torch already installed.

Install with `pip install --no-build-isolation .`: an isolated build would
install a fresh torch (a CUDA build of several GB) just to compile against it.
"""

from __future__ import annotations

import glob
import os
import sys

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


def _use_cuda() -> bool:
    if os.environ.get("FRNCCL_BUILD_CUDA") == "0":
        return False
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


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
    use_cuda = _use_cuda()
    sources = sorted(glob.glob(os.path.join(BACKEND, "*.cpp")))
    drop = CPU_ONLY if use_cuda else CUDA_ONLY
    sources = [s for s in sources if s not in drop]
    kwargs = dict(
        name="fr_backend._C",
        sources=sources,
        include_dirs=[os.path.join(HERE, BACKEND), os.path.join(HERE, "python", "fr_backend")],
        extra_compile_args={"cxx": ["-O2", "-fvisibility=hidden"]},
    )
    if use_cuda:
        kwargs["define_macros"] = [("FRNCCL_WITH_CUDA", "1")]
        nccl_include = _nccl_include_dir()
        if nccl_include is None:
            print("frnccl: nccl.h not found (set NCCL_INCLUDE_DIR): synchronous NCCL ops will each get an end event")
        else:
            kwargs["define_macros"].append(("FRNCCL_WITH_NCCL_HEADERS", "1"))
            kwargs["include_dirs"].append(nccl_include)
        return cpp_extension.CUDAExtension(**kwargs)
    return cpp_extension.CppExtension(**kwargs)


setup(
    name="frnccl",
    version="0.1.0",
    description="A flight-recording torch.distributed backend: every rank dumps its recent collectives when a job hangs",
    package_dir={"": "python"},
    packages=find_packages("python"),
    package_data={"fr_backend": ["dump_keys.def"]},
    python_requires=">=3.10",
    ext_modules=[_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
    entry_points={
        "torch.backends": ["frnccl = fr_backend._autoload:load"],
        "console_scripts": ["frnccl = fr_backend.cli:main"],
    },
    zip_safe=False,
)
