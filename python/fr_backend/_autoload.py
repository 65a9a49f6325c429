"""Target of the `torch.backends` entry point: runs inside `import torch`.

It must never raise (torch would turn that into a failed `import torch`) and
must stay cheap: it only registers the name; native code loads with the first group.
Importing this module runs the package's `__init__`, which registers the same way.
"""

from __future__ import annotations


def load() -> None:
    try:
        from ._registration import register_or_warn

        register_or_warn()
    except Exception:  # never break `import torch`, even if the package itself is broken
        pass
