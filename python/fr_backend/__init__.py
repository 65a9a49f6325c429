"""frnccl: a torch.distributed backend with a flight recorder.

`import fr_backend` registers the `frnccl` backend (the `torch.backends` entry
point does the same at `import torch`), so `init_process_group(backend="frnccl")`
works in an unmodified script.
"""

from __future__ import annotations

from typing import Any

from ._registration import register, register_or_warn
from .config import ConfigError, FrConfig

__all__ = ["register", "dump", "load_dump", "trace_entries", "ConfigError", "FrConfig"]

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
