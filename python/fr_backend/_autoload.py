"""Target of the `torch.backends` entry point: runs inside `import torch`.

It must never raise (torch would turn that into a failed `import torch`) and
must stay cheap: it only registers the name; native code loads with the first group.
"""

from __future__ import annotations


def load() -> None:
    try:
        from ._registration import register

        register()
    except Exception as err:  # never break `import torch`
        import warnings

        warnings.warn(f"frnccl: backend not registered ({type(err).__name__}: {err})", RuntimeWarning, stacklevel=2)
