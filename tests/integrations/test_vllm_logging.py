"""The "ops replaced" INFO line appears once in every process that runs vLLM (issue 25, item 2):
the serving process (which loads plugins before vLLM configures its logging) and each engine
core and worker, under both start methods (fork: the children inherit ``plugins_loaded=True`` and
never run the plugin). vLLM's own logger, plugin loader and ``get_mp_context`` run here (vLLM
0.33.0 in .venv-vllm, from scripts/setup_vllm_env.sh); the process tree is
tests/helpers/vllm_processes.py, whose order of calls is checked against vLLM's source below.
The first test needs no vLLM: it fakes ``vllm.logger`` to pin integrations/vllm_log.py."""
import ast
import collections
import os
import re

import pytest

from helpers.fresh_python import REPO, TESTS, run
from nvrtc_gather.integrations import activation
from test_vllm_real import PYTHON, vllm_dir  # noqa: F401  (the module-scoped fixture)

LINE = re.compile(r"^\((?P<name>\w+) pid=(?P<pid>\d+)\) INFO .*nvrtc_gather: torch\.ops\._C_cache_ops\.\{"
                  + re.escape(", ".join(activation.CACHE_OPS)) + r"\} now run nvrtc_gather's kernels", re.M)
# vLLM 0.33 has DeepSeek-V4: its gather's line (integrations/vllm_dsv4.py), once per process too
DSV4_LINE = re.compile(r"^\((?P<name>\w+) pid=(?P<pid>\d+)\) INFO .*nvrtc_gather: vLLM's dequantize_and_gather_k_cache "
                       r"\(vllm\.models\.deepseek_v4\.common\.ops, DeepSeek-V4\) now runs nvrtc_gather's kernel", re.M)


def test_a_line_waits_for_vllms_logging_and_is_repeated_in_a_forked_process():
    got = run("""
        import io, json, logging, os, sys, types
        vllm = types.ModuleType("vllm")
        vllm_logger = types.ModuleType("vllm.logger")
        out = io.StringIO()
        def _configure_vllm_root_logger(config=None):  # vLLM's: a handler on "vllm", propagate=False
            log = logging.getLogger("vllm")
            for h in log.handlers[:]:
                log.removeHandler(h)
            log.addHandler(logging.StreamHandler(out))
            log.setLevel(logging.INFO)
            log.propagate = False
        def configure_logging(config):  # looks the name up in its module, as vLLM's does
            vllm_logger._configure_vllm_root_logger(config)
        vllm_logger._configure_vllm_root_logger = _configure_vllm_root_logger
        vllm_logger.configure_logging = configure_logging
        vllm.logger = vllm_logger
        sys.modules.update({"vllm": vllm, "vllm.logger": vllm_logger})
        from nvrtc_gather.integrations import vllm as adapter, vllm_log
        adapter.register(["gather"])  # no handler yet: kept
        res = {"before": out.getvalue(), "pending": vllm_log.pending()}
        configure_logging(None)
        configure_logging(None)  # vLLM configures again: not repeated
        res["after"] = out.getvalue()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # a forked engine core: inherited, logged when vLLM configures logging here
            os.close(r)
            out.seek(0); out.truncate()
            child = {"inherited": len(vllm_log.pending())}
            configure_logging(None)
            child["log"] = out.getvalue()
            os.write(w, json.dumps(child).encode())
            os._exit(0)
        os.close(w)
        res["child"] = json.loads(os.read(r, 100000).decode())
        os.waitpid(pid, 0)
        res["untouched"] = vllm_logger._configure_vllm_root_logger.__wrapped__ is _configure_vllm_root_logger
        print(json.dumps(res))
    """)
    line = "nvrtc_gather: torch.ops._C_cache_ops.{cp_gather_indexer_k_quant_cache} now run nvrtc_gather's kernels"
    assert got["before"] == "" and len(got["pending"]) == 1 and line in got["pending"][0], got
    assert got["after"].count(line) == 1, got
    assert got["child"]["inherited"] == 1 and got["child"]["log"].count(line) == 1, got
    assert got["untouched"], got


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_line_appears_once_in_each_vllm_process(vllm_dir, method):
    import subprocess
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "NVRTC_GATHER_"))}
    env |= {"PYTHONPATH": os.pathsep.join([TESTS, REPO]), "VLLM_WORKER_MULTIPROC_METHOD": method}
    r = subprocess.run([PYTHON, "-m", "helpers.vllm_processes", "2"], capture_output=True, text=True, env=env,
                       timeout=600)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    lines = [(m["name"], m["pid"]) for m in LINE.finditer(log)]
    by_process = collections.Counter(lines)
    assert sorted(name for name, _ in by_process) == ["APIServer", "EngineCore", "Worker_TP0", "Worker_TP1"], log[-4000:]
    assert set(by_process.values()) == {1}, by_process  # once each: four processes, four pids
    assert len({pid for _, pid in by_process}) == 4, by_process
    dsv4 = collections.Counter((m["name"], m["pid"]) for m in DSV4_LINE.finditer(log))
    assert dsv4 == by_process, (dsv4, by_process)


def test_vllms_logging_configuration_is_left_as_vllm_makes_it(vllm_dir):
    got = run("""
        import json, logging
        import vllm.logger, vllm.plugins
        from helpers.vllm_processes import CONFIG
        vllm.plugins.load_general_plugins()
        vllm.logger.configure_logging(CONFIG)
        log = logging.getLogger("vllm")
        print(json.dumps({"handlers": [h.name for h in log.handlers], "propagate": log.propagate,
                          "root": len(logging.getLogger().handlers), "level": log.level,
                          "factory": type(logging.getLogRecordFactory()).__name__}))
    """, python=PYTHON, timeout=600)
    assert got == {"handlers": ["vllm"], "propagate": False, "root": 0, "level": 20,
                   "factory": "_VllmLogRecordFactory"}, got


def _function(tree, name, cls=None):
    for node in ast.walk(tree):
        if cls is None and isinstance(node, ast.FunctionDef) and node.name == name:
            return node
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"{cls}.{name} not found")


def _calls(fn) -> list[str]:
    """Calls in source order."""
    found = [n for n in ast.walk(fn) if isinstance(n, ast.Call)]
    return [ast.unparse(n.func) for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))]


def _first_call(fn) -> str:
    """The first call other than reading the config (``getattr(vllm_config, "logging_config", None)``)."""
    return [c for c in _calls(fn) if c != "getattr"][0]


def test_the_process_tree_follows_vllms_own_order(vllm_dir):
    """What helpers/vllm_processes.py stands in for, read in vLLM's installed source."""
    def tree(*parts):
        with open(os.path.join(vllm_dir, *parts)) as f:
            return ast.parse(f.read())
    logger = tree("logger.py")
    # every configure path ends in _configure_vllm_root_logger, looked up in vllm.logger; none runs at import
    assert "_configure_vllm_root_logger" in _calls(_function(logger, "configure_logging"))
    assert "configure_logging" in _calls(_function(logger, "configure_logging_if_needed"))
    assert "configure_logging_if_needed" in _calls(_function(logger, "configure_logging_from_args"))
    assert not [n for n in logger.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                and "configure" in ast.unparse(n.value.func)]
    # vllm serve's API server: plugins while its parser is built, logging after parsing
    args = tree("engine", "arg_utils.py")
    assert "load_general_plugins" in _calls(_function(args, "add_cli_args", "AsyncEngineArgs"))
    main = _calls(_function(tree("entrypoints", "cli", "main.py"), "main"))
    assert main.index("parser.parse_args") < main.index("configure_logging_from_args"), main
    # LLM(...): EngineArgs(...) loads plugins in __post_init__, then logging is configured
    assert "load_general_plugins" in _calls(_function(args, "__post_init__", "EngineArgs"))
    llm = _calls(_function(tree("entrypoints", "llm.py"), "__init__", "LLM"))
    assert llm.index("EngineArgs") < llm.index("configure_logging_if_needed"), llm
    # engine core: configure_logging first, plugins in EngineCore.__init__
    core = tree("v1", "engine", "core.py")
    assert _first_call(_function(core, "run_engine_core", "EngineCoreProc")) == "configure_logging"
    assert "load_general_plugins" in _calls(_function(core, "__init__", "EngineCore"))
    # worker: configure_logging first, plugins in init_worker
    worker = _calls(_function(tree("v1", "executor", "multiproc_executor.py"), "worker_main", "WorkerProc"))
    assert _first_call(_function(tree("v1", "executor", "multiproc_executor.py"), "worker_main", "WorkerProc")) \
        == "configure_logging", worker
    base = tree("v1", "worker", "worker_base.py")
    assert "load_general_plugins" in _calls(_function(base, "init_worker", "WorkerWrapperBase"))
    # the fork default, and the flag a forked child inherits
    assert "plugins_loaded = True" in ast.unparse(_function(tree("plugins", "__init__.py"), "load_general_plugins"))
