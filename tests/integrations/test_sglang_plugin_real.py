"""The SGLang plugin with SGLang's own loader, where SGLang is installed (the engine matrix,
scripts/engine_matrix.sh, installs each release with this checkout editable, so the package's
entry points are in that environment's metadata): the release loads plugins where the docs say
(``run_scheduler_process`` calls ``load_plugins()`` before ``configure_logger``), our entry point
is in its group, and a process started with multiprocessing's spawn context that does what the
scheduler does (tests/helpers/sglang_scheduler_like.py) has the hook without any code from the
user, and says so once in SGLang's log. Skipped without SGLang, unless
NVRTC_GATHER_REQUIRE_SGLANG=1."""
import ast
import importlib.metadata
import importlib.util
import multiprocessing
import os
import re

import pytest

from nvrtc_gather.integrations import sglang as hook
from helpers.sglang_v4_releases import v4_hooks

GROUP = "sglang.srt.plugins"


@pytest.fixture(scope="module")
def release():
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        msg = "SGLang is not installed here (scripts/engine_matrix.sh installs the real releases)"
        if os.environ.get("NVRTC_GATHER_REQUIRE_SGLANG") in ("1", "accessor"):
            pytest.fail(msg)
        pytest.skip(msg)


FIRST_LOADER = (0, 5, 11)  # the first release with sglang/srt/plugins (read in the 0.5.10 and 0.5.11 wheels)


@pytest.fixture(scope="module")
def loader(release):
    """The release, where it has SGLang's plugin loader; an older one skips (README: register())."""
    if tuple(map(int, release.split(".")[:3])) < FIRST_LOADER:
        pytest.skip(f"SGLang {release} has no plugin loader: register() is the way there (test_sglang_real.py)")
    return release


def test_a_release_before_the_loader_has_none(release):
    """README's claim: SGLang 0.5.10 (and older) has no sglang.srt.plugins, so nothing loads the plugin."""
    has = importlib.util.find_spec("sglang.srt.plugins") is not None
    assert has == (tuple(map(int, release.split(".")[:3])) >= FIRST_LOADER), f"SGLang {release}"


@pytest.fixture(scope="module")
def installed(loader):
    """The release, where this package is installed in the environment (its entry points live in
    installed metadata: the engine matrix installs the checkout editable); a checkout on
    PYTHONPATH (the GPU machine's scripts/gpu_check.sh) has none, and the tests that need them skip."""
    try:
        importlib.metadata.distribution("nvrtc-gather")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("nvrtc-gather is not installed here (run from a checkout on PYTHONPATH): its entry points are "
                    "not in this environment's metadata; scripts/engine_matrix.sh installs it")
    return loader


def _source(module: str) -> ast.Module:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module} is not in this SGLang"
    with open(spec.origin, encoding="utf-8") as f:
        return ast.parse(f.read())


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert found, f"no function {name}"
    return found[0]


def _calls(node) -> list[str]:
    """The names called in ``node``'s statements, in order (``f()`` and ``x.f()`` give ``f``)."""
    return [c.func.id if isinstance(c.func, ast.Name) else c.func.attr for c in ast.walk(node)
            if isinstance(c, ast.Call) and isinstance(c.func, (ast.Name, ast.Attribute))]


def test_the_release_loads_plugins_in_the_scheduler_before_it_configures_logging(loader):
    """What the plugin and its log line rely on (README, integrations/sglang_plugin.py)."""
    import sglang.srt.plugins as plugins

    release = loader
    assert plugins.GENERAL_PLUGINS_GROUP == GROUP, f"SGLang {release}"
    scheduler = _source("sglang.srt.managers.scheduler")
    body = _function(scheduler, "run_scheduler_process").body
    first = [i for i, stmt in enumerate(body) if "load_plugins" in _calls(stmt)]
    configure = [i for i, stmt in enumerate(body) if "configure_scheduler_process" in _calls(stmt)]
    assert first and configure and first[0] < configure[0], f"SGLang {release}: load_plugins() runs after logging setup"
    assert "configure_logger" in _calls(_function(scheduler, "configure_scheduler_process"))
    assert "configure_logger" in {n.name for n in _source("sglang.srt.utils.common").body
                                  if isinstance(n, ast.FunctionDef)}


def test_the_entry_point_is_installed_in_sglangs_group(installed):  # noqa: ARG001  (the fixture skips without an install)
    eps = [ep for ep in importlib.metadata.entry_points(group=GROUP) if ep.name == "nvrtc_gather"]
    assert [ep.value for ep in eps] == ["nvrtc_gather.integrations.sglang_plugin:plugin"], \
        "the package's sglang.srt.plugins entry point is not installed here (reinstall this checkout)"


def _spawned(env: dict) -> dict:
    from helpers import sglang_scheduler_like

    ctx = multiprocessing.get_context("spawn")  # SGLang's start method for its schedulers
    queue = ctx.Queue()
    child = ctx.Process(target=sglang_scheduler_like.run, args=(queue, env))
    child.start()
    try:
        got = queue.get(timeout=300)
    finally:
        child.join(timeout=60)
    assert "error" not in got, got["error"] + got["log"]
    return got


def _lines(got: dict) -> list[str]:
    return [line for line in got["log"].splitlines() if f"nvrtc_gather (pid {got['pid']}" in line]


def test_a_spawned_scheduler_has_the_hook_without_user_code_and_says_so_once(installed):
    release = installed
    got = _spawned({})
    module = next(name for name, introduced in hook.ACCESSORS
                  if tuple(map(int, release.split(".")[:3])) >= tuple(map(int, introduced.split("."))))
    v4 = v4_hooks(release)
    assert got["hooked"] == {"GetKAndS.execute": module, "SetKAndS.execute": module, **v4}, got["log"]
    assert got["plugin"]["failed"] is None and got["plugin"]["pending_log"] == []
    line, = _lines(got)
    also = (f", {' and '.join(v4)} in {re.escape(next(iter(v4.values())))}" if v4 else "")
    assert re.search(rf"TP0\] nvrtc_gather \(pid {got['pid']}[^)]*\): SGLang {re.escape(release)}: "
                     rf"GetKAndS\.execute and SetKAndS\.execute in {re.escape(module)}{also} now run", line), got["log"]


def test_a_spawned_scheduler_with_the_plugin_off_keeps_sglangs_kernels(installed):  # noqa: ARG001  (the fixture skips without an install)
    got = _spawned({"NVRTC_GATHER_SGLANG": "0"})
    assert got["hooked"] == {}
    line, = _lines(got)
    assert "SGLang plugin loaded but off (NVRTC_GATHER_SGLANG='0')" in line


def test_a_spawned_scheduler_hooks_only_the_ops_asked_for(installed):  # noqa: ARG001  (the fixture skips without an install)
    got = _spawned({"NVRTC_GATHER_SGLANG_OPS": "get"})
    assert list(got["hooked"]) == ["GetKAndS.execute"]
    line, = _lines(got)
    assert re.search(r"; (\S+, )*SetKAndS\.execute(, \S+)* left to SGLang", line), line
