"""The SGLang plugin as SGLang runs it, without SGLang installed (issue 34, "Adopted without
code"): the entry point, NVRTC_GATHER_SGLANG / NVRTC_GATHER_SGLANG_OPS, register(ops=), the line
in SGLang's log after SGLang configures logging, and a failure that leaves SGLang running on its
own kernels. SGLang's loader and scheduler start are stand-ins (tests/helpers/
sglang_plugin_standin.py); test_sglang_plugin_real.py runs SGLang's own."""
import importlib
import logging
import re
import sys
from pathlib import Path

import pytest

from helpers import sglang_plugin_standin, sglang_standin
from helpers.fresh_python import run
from nvrtc_gather.integrations import sglang as hook
from nvrtc_gather.integrations import sglang_activation, sglang_dsv4, sglang_log, sglang_plugin
from nvrtc_gather.integrations.pending_lines import PendingLines

NEWEST, *_ = hook.MODULES
ROOT = Path(__file__).resolve().parents[2]
ENVS = ("NVRTC_GATHER_SGLANG", "NVRTC_GATHER_SGLANG_OPS", "SGLANG_PLUGINS")


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """The stand-in SGLang (accessor and plugin loader) imported as sglang; plugin state reset."""
    for name in ENVS:
        monkeypatch.delenv(name, raising=False)
    saved = {k: m for k, m in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for k in saved:
        del sys.modules[k]

    def make(**options):
        root = sglang_standin.write(tmp_path, (NEWEST,), **options)
        sglang_plugin_standin.write(root)
        monkeypatch.syspath_prepend(root)
        importlib.invalidate_caches()
        return root
    monkeypatch.setattr(sglang_plugin, "_state", {"ran": False, "ops": (), "off": None, "failed": None})
    monkeypatch.setattr(sglang_log, "_lines", PendingLines())
    yield make
    hook.unregister()
    for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
        del sys.modules[k]
    sys.modules.update(saved)


# -- the variables -----------------------------------------------------------------------------

@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("TRUE", True), ("yes", True), (" On ", True),
                                       ("0", False), ("false", False), ("No", False), ("off", False), ("", False)])
def test_enable_variable_is_a_strict_boolean(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("NVRTC_GATHER_SGLANG", raising=False)
    else:
        monkeypatch.setenv("NVRTC_GATHER_SGLANG", value)
    assert sglang_activation.sglang_enabled() is on


@pytest.mark.parametrize("value", ["2", "enable", "nvrtc_gather", "0,1"])
def test_enable_variable_refuses_other_values_naming_it(monkeypatch, value):
    monkeypatch.setenv("NVRTC_GATHER_SGLANG", value)
    with pytest.raises(ValueError, match=f"NVRTC_GATHER_SGLANG={value!r} is not a boolean: set it to 1, true"):
        sglang_activation.sglang_enabled()


ALL = ("get", "set", "dsv4_bf16", "dsv4_fp8")


@pytest.mark.parametrize("value, ops", [(None, ALL), ("", ALL), ("  ", ALL),
                                        ("get", ("get",)), ("SET", ("set",)), (" set , get", ("get", "set")),
                                        ("get,get", ("get",)), ("dsv4_fp8,get", ("get", "dsv4_fp8"))])
def test_ops_variable_selects_ops_and_empty_means_all(monkeypatch, value, ops):
    if value is None:
        monkeypatch.delenv("NVRTC_GATHER_SGLANG_OPS", raising=False)
    else:
        monkeypatch.setenv("NVRTC_GATHER_SGLANG_OPS", value)
    assert sglang_activation.sglang_ops() == ops


@pytest.mark.parametrize("value", ["gather", "get,", "get;set", "GetKAndS"])
def test_ops_variable_refuses_unknown_names_naming_it(monkeypatch, value):
    monkeypatch.setenv("NVRTC_GATHER_SGLANG_OPS", value)
    with pytest.raises(ValueError, match=f"NVRTC_GATHER_SGLANG_OPS={re.escape(repr(value))}: expected a "
                                         "comma-separated list of get, set"):
        sglang_activation.sglang_ops()


def test_every_op_of_the_table_has_its_hook():
    """One row per op in each table: an op added to one and not the other fails here."""
    assert tuple(hook._HOOKS) == sglang_activation.ALL_OPS
    for op, (cls_name, _) in hook._HOOKS.items():
        assert sglang_activation.OPS[op] == (f"{cls_name}.execute" if cls_name else sglang_dsv4.FUNCTIONS[op])


def test_the_entry_point_is_declared_in_sglangs_group():
    """SGLang 0.5.11-0.5.23 load the group sglang.srt.plugins (sglang/srt/plugins/__init__.py)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["sglang.srt.plugins"] == {
        "nvrtc_gather": "nvrtc_gather.integrations.sglang_plugin:plugin"}
    assert sglang_plugin_standin.ENTRY_POINT == "nvrtc_gather = nvrtc_gather.integrations.sglang_plugin:plugin"


# -- register(ops=) ----------------------------------------------------------------------------

def test_register_hooks_the_ops_asked_for_and_adds_later_ones(standin):
    standin()
    module = importlib.import_module(NEWEST)
    assert hook.register(ops="get") == (NEWEST,)
    assert hook._TAG in module.GetKAndS.__dict__ and hook._TAG not in module.SetKAndS.__dict__
    assert hook.status()["hooked"] == {"GetKAndS.execute": NEWEST}
    assert hook.register(ops=["set"]) == (NEWEST,)
    assert hook.status()["hooked"] == {"GetKAndS.execute": NEWEST, "SetKAndS.execute": NEWEST}


@pytest.mark.parametrize("ops, error, match", [
    ("scatter", ValueError, "ops='scatter': expected a comma-separated list of get, set"),
    ("", ValueError, "ops='': expected"), (3, TypeError, "ops: expected op names"),
    (["get", 1], TypeError, "ops: expected op names")])
def test_register_refuses_other_ops_naming_the_argument(standin, ops, error, match):
    standin()
    with pytest.raises(error, match=match):
        hook.register(ops=ops)
    assert hook.status()["hooked"] == {}


# -- plugin(), in this process -----------------------------------------------------------------

def test_a_failed_register_is_a_warning_and_undoes_what_it_hooked(standin, monkeypatch, caplog):
    """Whatever register() raises, the process goes on with SGLang's own execute methods."""
    standin()
    module = importlib.import_module(NEWEST)
    original = module.SetKAndS.__dict__["execute"]

    def broken(sglang_execute):
        raise RuntimeError("a hook that cannot be made")
    monkeypatch.setitem(hook._HOOKS, "set", ("SetKAndS", broken))
    with caplog.at_level(logging.INFO):
        sglang_plugin.plugin()  # does not raise
    assert hook._TAG not in module.GetKAndS.__dict__, "GetKAndS was hooked before the failure: undone"
    assert module.SetKAndS.__dict__["execute"] is original
    assert hook.status()["hooked"] == {}
    assert sglang_plugin.status()["failed"] == "RuntimeError: a hook that cannot be made"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "SGLang's own kernels run: RuntimeError: a hook that cannot be made" in \
        warnings[0].getMessage()


def test_a_missing_dependency_of_the_accessor_is_named_in_the_warning(standin, caplog):
    standin(broken="a_module_sglang_needs")
    with caplog.at_level(logging.INFO):
        sglang_plugin.plugin()
    warning, = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"has {NEWEST}, but importing it failed: No module named 'a_module_sglang_needs'" in warning
    assert hook.status()["hooked"] == {}


def test_without_sglang_the_plugin_warns_and_returns(standin, monkeypatch, caplog):
    monkeypatch.setattr(hook, "_find_accessor", lambda: (_ for _ in ()).throw(ImportError("no sglang here")))
    with caplog.at_level(logging.INFO):
        sglang_plugin.plugin()
    assert sglang_plugin.status()["failed"] == "no sglang here"


# -- plugin() as SGLang runs it: a fresh interpreter (spawn) with the stand-in loader ----------

SCHEDULER = """
    import io, json, sys
    sys.stderr = io.StringIO()  # where SGLang's basicConfig (and the last-resort handler) write
    sys.path.insert(0, {root!r})
    import sglang.srt.managers.scheduler as scheduler
    from nvrtc_gather.integrations import sglang_log
    scheduler.run_scheduler_process(prefix=" TP0")  # load_plugins(), then configure_logger
    from nvrtc_gather.integrations import sglang, sglang_plugin
    print(json.dumps({{"hooked": sglang.status()["hooked"], "plugin": sglang_plugin.status(),
                      "log": sys.stderr.getvalue()}}))
"""


def _scheduler(tmp_path, broken=None, **env):
    root = sglang_standin.write(tmp_path, (NEWEST,), broken=broken)
    sglang_plugin_standin.write(root)
    return run(SCHEDULER.format(root=root), **env)


def _lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if "nvrtc_gather (pid" in line]


def test_a_scheduler_process_hooks_both_ops_and_says_so_once_in_sglangs_log(tmp_path):
    got = _scheduler(tmp_path)
    assert got["hooked"] == {"GetKAndS.execute": NEWEST, "SetKAndS.execute": NEWEST}
    assert got["plugin"] == {"ran": True, "ops": list(ALL), "off": None, "failed": None, "pending_log": []}
    line, = _lines(got["log"])
    # SGLang's format with the scheduler's prefix: logged after configure_logger, not before
    assert re.match(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] nvrtc_gather \(pid \d+, MainProcess\): SGLang 0\.5\.99: "
                    rf"GetKAndS\.execute and SetKAndS\.execute in {re.escape(NEWEST)} now run nvrtc_gather's kernels",
                    line), got["log"]


def test_the_ops_variable_leaves_the_others_to_sglang_and_the_line_says_so(tmp_path):
    got = _scheduler(tmp_path, NVRTC_GATHER_SGLANG_OPS="set")
    assert got["hooked"] == {"SetKAndS.execute": NEWEST}
    line, = _lines(got["log"])
    assert "SetKAndS.execute in" in line and "; GetKAndS.execute left to SGLang" in line


def test_off_hooks_nothing_and_the_line_gives_the_value(tmp_path):
    got = _scheduler(tmp_path, NVRTC_GATHER_SGLANG="Off")
    assert got["hooked"] == {} and got["plugin"]["off"] == "NVRTC_GATHER_SGLANG='Off'"
    line, = _lines(got["log"])
    assert "TP0] nvrtc_gather (pid" in line
    assert "SGLang plugin loaded but off (NVRTC_GATHER_SGLANG='Off'); SGLang's own kernels run" in line


@pytest.mark.parametrize("env, named", [({"NVRTC_GATHER_SGLANG": "2"}, "NVRTC_GATHER_SGLANG='2' is not a boolean"),
                                        ({"NVRTC_GATHER_SGLANG_OPS": "gather"},
                                         "NVRTC_GATHER_SGLANG_OPS='gather': expected a comma-separated list")])
def test_a_bad_value_is_sglangs_plugin_error_naming_the_variable_and_sglang_goes_on(tmp_path, env, named):
    """As the vLLM plugin: the plugin raises; SGLang's loader logs it with the traceback and
    the process continues with SGLang's own kernels."""
    got = _scheduler(tmp_path, **env)
    assert got["hooked"] == {}
    assert "Failed to execute general plugin: nvrtc_gather" in got["log"] and named in got["log"]


def test_a_broken_sglang_is_a_warning_in_the_scheduler_not_a_plugin_error(tmp_path):
    got = _scheduler(tmp_path, broken="a_module_sglang_needs")
    assert got["hooked"] == {} and "No module named 'a_module_sglang_needs'" in got["plugin"]["failed"]
    assert "Failed to execute general plugin" not in got["log"]
    assert "SGLang plugin could not hook SGLang's index-K accessor, SGLang's own kernels run" in got["log"]


def test_sglang_plugins_naming_others_leaves_ours_out(tmp_path):
    got = _scheduler(tmp_path, SGLANG_PLUGINS="someone_else")
    assert got["hooked"] == {} and got["plugin"]["ran"] is False and _lines(got["log"]) == []
