"""A process started as SGLang starts a scheduler (multiprocessing's spawn context), doing what
SGLang's ``run_scheduler_process`` does before it builds the scheduler (0.5.11-0.5.23,
``sglang/srt/managers/scheduler.py``): ``load_plugins()`` first, then ``configure_logger`` with the
process's prefix (``configure_scheduler_process``), through the name its module imported at
import time. No nvrtc_gather code is called before ``load_plugins()``. Needs SGLang installed."""
import io
import os
import sys
import traceback
from types import SimpleNamespace

from sglang.srt.plugins import load_plugins
from sglang.srt.utils import configure_logger  # a global bound at import, as in the scheduler's module


def run(queue, env: dict) -> None:
    """Report ``{"pid", "hooked", "plugin", "log"}`` on ``queue`` (``{"error", "log"}`` if
    anything raises); ``env`` is set first."""
    os.environ.update(env)
    log = sys.stderr = io.StringIO()  # where SGLang's basicConfig and the last-resort handler write
    try:
        load_plugins()
        configure_logger(SimpleNamespace(log_level="info"), prefix=" TP0")
        from nvrtc_gather.integrations import sglang, sglang_plugin  # only to read what happened
        queue.put({"pid": os.getpid(), "hooked": sglang.status()["hooked"], "plugin": sglang_plugin.status(),
                   "log": log.getvalue()})
    except BaseException:  # the parent shows it: this process's stderr is the StringIO
        queue.put({"error": traceback.format_exc(), "log": log.getvalue()})
