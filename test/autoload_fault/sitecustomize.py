"""Loaded through PYTHONPATH by test_lifecycle.py: makes torch's Backend.register_backend raise, as a torch
that refuses the registration would, to show that `import torch` still works."""

import importlib.abc
import importlib.machinery
import sys


class _RefuseRegistration(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch.distributed.distributed_c10d":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)

            def refuse(*args, **kwargs):
                raise ValueError("registration refused for the test")

            module.Backend.register_backend = staticmethod(refuse)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _RefuseRegistration())
