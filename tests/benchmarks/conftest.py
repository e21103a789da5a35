"""The benchmark's modules import each other by their top-level names (benchmarks/ on sys.path,
as when they run as scripts): the ``bench`` fixture puts it there for a test module."""
import os
import subprocess
import sys

import pytest

from helpers.fresh_python import REPO

BENCH = os.path.join(REPO, "benchmarks")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, BENCH)
    try:
        import bench
        yield bench
    finally:
        sys.path.remove(BENCH)


@pytest.fixture
def run_bench():
    """``run_bench(*args)``: ``python benchmarks/bench.py ARGS`` from the checkout, as gpu_check.sh runs it."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    return lambda *args: subprocess.run([sys.executable, os.path.join(BENCH, "bench.py"), *args],
                                        capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
