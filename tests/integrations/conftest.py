"""Fixtures of the adapter tests."""
import importlib
import sys

import pytest

from helpers import sglang_standin
from nvrtc_gather.integrations import sglang as hook

NEWEST, *_ = hook.MODULES


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """Import the stand-in package under the name sglang (any real one is hidden for the test);
    returns a function making it: (modules, **options) -> the pool module of the first."""
    def make(modules=(NEWEST,), **options):
        root = sglang_standin.write(tmp_path, modules, **options)
        monkeypatch.syspath_prepend(root)
        importlib.invalidate_caches()
        if not options.get("broken") and modules[0] in hook.MODULES:
            return importlib.import_module(sglang_standin.pool_module(0))
    saved = {k: m for k, m in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for k in saved:
        del sys.modules[k]
    yield make
    hook.unregister()
    for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
        del sys.modules[k]
    sys.modules.update(saved)


