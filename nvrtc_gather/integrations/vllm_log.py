"""The adapter's announcement lines in vLLM's log: once in every process that runs vLLM.

vLLM 0.33 gives its ``vllm`` logger a handler (``propagate=False``) only when a process calls
``vllm.logger.configure_logging`` (which runs ``_configure_vllm_root_logger``), not at import, and
not always before it loads general plugins:
- ``vllm serve``'s API server loads plugins while it builds its argument parser
  (``AsyncEngineArgs.add_cli_args``, ``vllm/engine/arg_utils.py``), before
  ``configure_logging_from_args`` (``vllm/entrypoints/cli/main.py``); ``LLM(...)`` loads them in
  ``EngineArgs.__post_init__`` before ``configure_logging_if_needed`` (``vllm/entrypoints/llm.py``).
  An INFO line logged by the plugin there reaches no handler.
- With the fork start method the engine core and the workers inherit ``plugins_loaded=True`` and
  our overrides, so the plugin never runs there; each configures logging first thing
  (``EngineCoreProc.run_engine_core``, ``WorkerProc.worker_main``).

So :func:`announce` logs a line at once where a handler can show it, else keeps it and logs it
right after vLLM next configures its logging in this process; a forked process (another pid)
logs the lines it inherited when vLLM configures logging there. Each line appears at most once per
process. vLLM's logging configuration is not changed: ``vllm.logger._configure_vllm_root_logger``
is wrapped to run unchanged and then log what is pending. Where that function does not exist
(another vLLM), lines are logged at once, as they are outside vLLM."""
from __future__ import annotations

import functools
import importlib
import sys
import threading

from .pending_lines import PendingLines

CONFIGURE = "_configure_vllm_root_logger"  # in vllm/logger.py: every configure path runs it
_TAG = "_nvrtc_gather_log_hook"

_lock = threading.Lock()  # the wrapping of vLLM's configure function
_lines = PendingLines()
_logger = {"get": None}


def announce(get_logger, level: int, msg: str, *args) -> None:
    """Log ``msg % args`` with the logger ``get_logger()`` once in this process and once in
    every process forked from it in which vLLM configures its logging."""
    _logger["get"] = get_logger
    _lines.add(level, msg, args)
    watching = _watch_vllm_logging()
    if not watching or get_logger().hasHandlers():
        flush()


def pending() -> list[str]:
    """The lines not yet logged in this process (for status and tests)."""
    return _lines.pending()


def flush() -> None:
    """Log, in this process, every announced line not yet logged here."""
    for level, msg, args in _lines.take():
        _logger["get"]().log(level, msg, *args)


def _watch_vllm_logging() -> bool:
    """Wrap vLLM's logging setup so that pending lines follow it; False where there is none."""
    if "vllm" not in sys.modules:
        return False
    try:
        module = importlib.import_module("vllm.logger")
    except Exception:  # a vLLM whose logger module cannot load here
        return False
    with _lock:
        original = getattr(module, CONFIGURE, None)
        if not callable(original):
            return False
        if getattr(original, _TAG, False):
            return True

        @functools.wraps(original)
        def configure(*args, **kwargs):
            result = original(*args, **kwargs)
            flush()
            return result

        setattr(configure, _TAG, True)
        setattr(module, CONFIGURE, configure)
        return True
