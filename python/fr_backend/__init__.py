"""frnccl: a torch.distributed backend with a flight recorder.

The `torch.backends` entry point registers the `frnccl` backend at `import torch`
(and `import fr_backend` does where torch's entry points are off), so
`init_process_group(backend="frnccl")` works in an unmodified script.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ._registration import register, register_or_warn
from .config import ConfigError, FrConfig
from .verdict import Verdict, VerdictError, on_verdict, read_verdict_file

__all__ = ["register", "dump", "load_dump", "trace_entries", "ConfigError", "FrConfig", "Verdict", "VerdictError",
           "on_verdict", "read_verdict_file"]

# Registering imports torch. Where torch is not imported yet and its entry points load (the default), `import torch`
# registers frnccl later anyway: torch stays unimported until then, so that the `frnccl` command (whose analyzer
# needs no torch) starts fast and prints nothing of torch's own, such as its import-time warnings.
if "torch" in sys.modules or os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") != "1":
    register_or_warn()  # call register() to see a failure raised


def dump(reason: str = "manual") -> str:
    """Write this rank's dump now; returns the incident folder it went to."""
    from ._native import native

    return str(native().dump(reason))


def load_dump(path: str) -> dict[str, Any]:
    """Read one dump file (pickle or JSON, frnccl or torch format) without running any code from it."""
    from .analyzer.load import load_dump as _load

    return _load(path)


def trace_entries(symbolize: bool = True) -> dict[str, Any]:
    """This process's recorder content, in the dump schema, without writing a file."""
    from ._native import native
    from .analyzer.load import safe_loads

    return dict(safe_loads(bytes(native().trace_pickle(symbolize))))
