"""Loads the C++ extension on first use, so `import torch` stays fast."""

from __future__ import annotations

import threading
from types import ModuleType

_lock = threading.Lock()
_module: ModuleType | None = None


def native() -> ModuleType:
    global _module
    if _module is None:
        with _lock:
            if _module is None:
                import torch  # noqa: F401  (libc10 must be loaded before the extension)
                import torch.distributed  # noqa: F401  (registers the Backend type)

                from . import _C  # type: ignore[attr-defined]

                _module = _C
    return _module


def loaded() -> ModuleType | None:
    return _module
