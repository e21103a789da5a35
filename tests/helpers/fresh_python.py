"""Run a snippet in a fresh interpreter: op registrations, plugins and import hooks are
process-wide, so each scenario gets its own process."""
import json
import os
import subprocess
import sys
import textwrap

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # helpers/ importable
REPO = os.path.dirname(TESTS)
# Variables of the scenario's own making only: the caller's settings would change what it tests.
_DROP = ("VLLM_PLUGINS", "NVRTC_GATHER_VLLM", "NVRTC_GATHER_VLLM_OPS", "NVRTC_GATHER_DEBUG", "SGLANG_PLUGINS",
         "NVRTC_GATHER_SGLANG", "NVRTC_GATHER_SGLANG_OPS")


def run(code: str, *, python: str = sys.executable, path=(), timeout: int = 300, **env) -> dict:
    """Run ``code`` (dedented) with ``python``; tests/, the repo and ``path`` lead its
    PYTHONPATH. It must print one JSON line last, which is returned."""
    r = run_raw(code, python=python, path=path, timeout=timeout, **env)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_raw(code: str, *, python: str = sys.executable, path=(), timeout: int = 300,
            **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in _DROP}
    pythonpath = os.pathsep.join([*path, TESTS, REPO, os.environ.get("PYTHONPATH", "")])
    return subprocess.run([python, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=base | {"PYTHONPATH": pythonpath} | env, timeout=timeout)
