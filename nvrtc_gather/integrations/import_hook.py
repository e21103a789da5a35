"""Code run right after a module is first executed, however it is imported: a finder at the front
of ``sys.meta_path`` lets the real finders locate the module and wraps its loader's
``exec_module``. The vLLM adapter's worker hook (vllm_worker.py) and its DeepSeek-V4 hook
(vllm_dsv4.py) are subclasses."""
from __future__ import annotations

import importlib.abc
import sys


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``self.after(name, module)`` once a module named in ``names`` has executed."""

    def __init__(self, names):
        self.names = frozenset(names)

    def after(self, name: str, module) -> None:
        raise NotImplementedError

    def find_spec(self, name, path, target=None):
        if name not in self.names:
            return None
        for finder in sys.meta_path:  # the real finders locate it
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            self.after(name, module)

        spec.loader.exec_module = exec_module
        return spec
