"""The SGLang adapter's announcement lines in SGLang's log: once in every process that hooks.

SGLang configures logging per process with ``sglang.srt.utils.common.configure_logger``
(``logging.basicConfig(force=True)`` on the root logger, or ``dictConfig`` from
``SGLANG_LOGGING_CONFIG_PATH``), and in 0.5.11-0.5.23 calls ``load_plugins()`` before it: first
thing in ``run_scheduler_process``, before ``configure_scheduler_process`` runs
``configure_logger`` (``sglang/srt/managers/scheduler.py``); in ``python -m sglang.launch_server``
before the server's arguments are parsed, ``configure_logger`` following in
``Engine._launch_subprocesses`` (``sglang/srt/entrypoints/engine.py``). A spawned process has no
handler until then, and Python's last-resort handler shows WARNING and above only: an INFO line
logged by the plugin would reach no one.

So :func:`announce` logs a line at once where a handler can show it, else keeps it and logs it
right after SGLang next configures logging in this process: ``configure_logger`` is wrapped (it
runs unchanged, then the pending lines are logged) in every loaded module that holds it under
that name (``sglang.srt.utils.common``, its re-export ``sglang.srt.utils``, and modules that
imported it by name, the scheduler's among them). Where none is loaded, lines are logged at
once. Each line names the process it is logged in; a forked process logs its inherited lines
again when SGLang configures logging there."""
from __future__ import annotations

import functools
import logging
import os
import sys
import threading

from .pending_lines import PendingLines

CONFIGURE = "configure_logger"
SOURCE = "sglang.srt.utils.common"  # where every release 0.5.10-0.5.23 defines it
_TAG = "_nvrtc_gather_log_hook"

_lock = threading.Lock()  # the wrapping of configure_logger
_lines = PendingLines()


def logger() -> logging.Logger:
    """``sglang.nvrtc_gather`` in a process that runs SGLang (its lines follow SGLang's logging
    configuration, a dictConfig naming ``sglang`` included), else this adapter's module logger.
    (Not ``nvrtc_gather.*`` for the test below: the package gives that logger a NullHandler.)"""
    return logging.getLogger("sglang.nvrtc_gather" if "sglang" in sys.modules else "nvrtc_gather.integrations.sglang")


def announce(level: int, msg: str, *args) -> None:
    """Log ``msg % args``, prefixed with ``nvrtc_gather (<process>):``, once in this process
    (now, or after SGLang configures its logging) and once in each forked one."""
    _lines.add(level, msg, args)
    if not _watch_sglang_logging() or logger().hasHandlers():
        flush()


def pending() -> list[str]:
    """The lines not yet logged in this process (for status and tests)."""
    return _lines.pending()


def flush() -> None:
    """Log, in this process, every announced line not yet logged here."""
    for level, msg, args in _lines.take():
        logger().log(level, "nvrtc_gather (%s): " + msg, process(), *args)


def process() -> str:
    """This process as SGLang names it: its pid and, where SGLang set one, its title
    (``sglang::scheduler_TP0``), else multiprocessing's name for it."""
    title = None
    setproctitle = sys.modules.get("setproctitle")
    try:
        title = setproctitle.getproctitle() if setproctitle is not None else None
    except Exception:  # noqa: BLE001  a title is a nicety, never a failure
        title = None
    if not (title or "").startswith("sglang::"):
        mp = sys.modules.get("multiprocessing")
        title = mp.current_process().name if mp is not None else None
    return f"pid {os.getpid()}" + (f", {title}" if title else "")


def _watch_sglang_logging() -> bool:
    """Wrap SGLang's configure_logger wherever a loaded module holds it; False where SGLang's
    logging module is not loaded."""
    source = sys.modules.get(SOURCE)
    original = getattr(source, CONFIGURE, None) if source is not None else None
    if not callable(original):
        return False
    with _lock:
        wrapped = original if getattr(original, _TAG, False) else _wrap(original)
        original = getattr(original, "__wrapped__", original)
        for module in list(sys.modules.values()):  # a dict lookup each (~1 ms in all): no __getattr__ runs
            try:
                held = vars(module).get(CONFIGURE)
            except Exception:  # noqa: BLE001  something in sys.modules that is not a module
                continue
            if held is original:
                setattr(module, CONFIGURE, wrapped)
    return True


def _wrap(original):
    @functools.wraps(original)
    def configure_logger(*args, **kwargs):
        result = original(*args, **kwargs)
        flush()
        return result

    setattr(configure_logger, _TAG, True)
    return configure_logger
