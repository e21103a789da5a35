"""SGLang's plugin loader, logging setup and scheduler start, as stand-ins written from SGLang's
source (0.5.11-0.5.23: ``sglang/srt/plugins/__init__.py`` is the same file in all of them;
``configure_logger`` in ``sglang/srt/utils/common.py``; ``run_scheduler_process`` in
``sglang/srt/managers/scheduler.py``), added to a stand-in package of sglang_standin.write.
tests/integrations/test_sglang_plugin_real.py runs SGLang's own loader instead.

Kept faithful where the plugin touches them: ``load_plugins()`` runs once per process, calls
every entry point of the group ``sglang.srt.plugins`` that ``SGLANG_PLUGINS`` (when set) names,
and logs (``logger.exception``) whatever loading or calling one raises, then goes on;
``configure_logger`` is ``logging.basicConfig(force=True)`` with SGLang's format and the
process's prefix; the scheduler imports ``configure_logger`` by name at import and calls
``load_plugins()`` before it."""
import os

PLUGINS = '''
import logging
import os
from importlib.metadata import entry_points

logger = logging.getLogger(__name__)
GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"
_plugins_loaded = False


def load_plugins():
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    allowed_set = {x.strip() for x in allowed.split(",") if x.strip()} if allowed else None
    plugins = {}
    for ep in entry_points(group=GENERAL_PLUGINS_GROUP):
        if allowed_set is not None and ep.name not in allowed_set:
            continue
        try:
            plugins[ep.name] = ep.load()
        except Exception:
            logger.exception("Failed to load plugin %s from group %s", ep.name, GENERAL_PLUGINS_GROUP)
    for name, func in plugins.items():
        try:
            func()
            logger.info("Executed general plugin: %s", name)
        except Exception:
            logger.exception("Failed to execute general plugin: %s", name)
'''

COMMON = '''
import logging


def configure_logger(server_args, prefix: str = ""):
    format = f"[%(asctime)s{prefix}] %(message)s"
    logging.basicConfig(level=getattr(logging, server_args.log_level.upper()), format=format,
                        datefmt="%Y-%m-%d %H:%M:%S", force=True)
'''

SCHEDULER = '''
from types import SimpleNamespace

from sglang.srt.plugins import load_plugins
from sglang.srt.utils import configure_logger


def configure_scheduler_process(server_args, prefix):
    configure_logger(server_args, prefix=prefix)


def run_scheduler_process(log_level="info", prefix=" TP0"):
    # Load plugins so hooks can override Scheduler and its dependencies.
    load_plugins()
    configure_scheduler_process(SimpleNamespace(log_level=log_level), prefix)
'''

ENTRY_POINT = "nvrtc_gather = nvrtc_gather.integrations.sglang_plugin:plugin"


def write(root, entry_point: str = ENTRY_POINT) -> str:
    """Add the loader, ``sglang.srt.utils`` and the scheduler to the stand-in package under
    ``root``, and a distribution declaring ``entry_point`` in the group ``sglang.srt.plugins``
    (pyproject.toml's, by default). Returns ``root``."""
    root = str(root)
    files = {("sglang", "srt", "plugins", "__init__.py"): PLUGINS,
             ("sglang", "srt", "utils", "common.py"): COMMON,
             ("sglang", "srt", "utils", "__init__.py"): "from sglang.srt.utils.common import *\n",
             ("sglang", "srt", "managers", "__init__.py"): "",
             ("sglang", "srt", "managers", "scheduler.py"): SCHEDULER,
             ("nvrtc_gather_plugin_standin-0.dist-info", "METADATA"):
                 "Metadata-Version: 2.1\nName: nvrtc-gather-plugin-standin\nVersion: 0\n",
             ("nvrtc_gather_plugin_standin-0.dist-info", "entry_points.txt"):
                 f"[sglang.srt.plugins]\n{entry_point}\n"}
    for parts, text in files.items():
        os.makedirs(os.path.join(root, *parts[:-1]), exist_ok=True)
        with open(os.path.join(root, *parts), "w") as f:
            f.write(text)
    return root
