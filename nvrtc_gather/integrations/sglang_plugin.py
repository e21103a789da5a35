"""The SGLang plugin: :func:`plugin`, the package's ``sglang.srt.plugins`` entry point
``nvrtc_gather``, so that every SGLang process hooks the index-K accessor without user code.

SGLang 0.5.11-0.5.23 (``sglang/srt/plugins/__init__.py``, the same file in every one of them)
calls every entry point of the group ``sglang.srt.plugins`` from ``load_plugins()``, once per
process, in the launcher (``sglang/launch_server.py``, ``sglang/cli/serve.py``, ``Engine``) and
first thing in every scheduler process (``run_scheduler_process``, ``sglang/srt/managers/
scheduler.py``; schedulers are started with spawn), from 0.5.22 also in the detokenizer and the
data-parallel controller. ``SGLANG_PLUGINS`` (comma-separated entry-point names) restricts which
are loaded. SGLang catches and logs (ERROR, with the traceback) whatever a plugin raises, and
goes on. SGLang 0.5.10 has no plugin loader: there, call ``sglang.register()`` in each process.

:func:`plugin` hooks the ops of ``NVRTC_GATHER_SGLANG_OPS`` (default all) unless
``NVRTC_GATHER_SGLANG`` is off (integrations/sglang_activation.py). A bad value of either
raises, naming the variable, as the vLLM plugin does: SGLang's loader logs it and runs its own
kernels. Any failure to hook (SGLang's accessor module missing or failing to import, anything
register() raises) is logged as a WARNING naming the cause, whatever register() hooked is
undone, and SGLang's own kernels run. Importing this module imports nvrtc_gather (torch, which
SGLang has already imported) and nothing of SGLang or CUDA; register() imports the accessor."""
from __future__ import annotations

import logging
import os
import threading

import torch

from . import sglang_activation, sglang_log

_lock = threading.Lock()
_state = {"ran": False, "ops": (), "off": None, "failed": None}


def status() -> dict:
    """What the plugin did in this process: ``{"ran": bool, "ops": the short names it asked
    for, "off": why it stayed off or None, "failed": the cause of a failed register() or None,
    "pending_log": lines waiting for SGLang's logging}``; sglang.status() says what is hooked."""
    with _lock:
        return {**_state, "pending_log": sglang_log.pending()}


def plugin() -> None:
    """The ``sglang.srt.plugins`` entry point (see the module docstring)."""
    off = None
    if not sglang_activation.sglang_enabled():  # raises on a value that is not a boolean
        off = f"{sglang_activation.ENABLE_ENV}={os.environ.get(sglang_activation.ENABLE_ENV)!r}"
    elif torch.version.hip is not None:
        off = "a ROCm build of torch (NVRTC kernels need an NVIDIA GPU)"
    ops = sglang_activation.sglang_ops() if off is None else ()  # raises on an unknown name
    with _lock:
        _state.update(ran=True, ops=ops, off=off)
    if off is not None:
        sglang_log.announce(logging.INFO, "SGLang plugin loaded but off (%s); SGLang's own kernels run", off)
        return
    try:
        from . import sglang
        sglang.register(ops)
    except Exception as e:  # noqa: BLE001  never SGLang's process: say why, leave SGLang's kernels
        cause = str(e) if isinstance(e, ImportError) else f"{type(e).__name__}: {e}"
        with _lock:
            _state["failed"] = cause
        _undo()
        sglang_log.logger().warning("nvrtc_gather (%s): SGLang plugin could not hook SGLang's index-K accessor, "
                                    "SGLang's own kernels run: %s", sglang_log.process(), cause)


def _undo() -> None:
    """Give SGLang back whatever a failed register() hooked (never raises)."""
    try:
        from . import sglang
        sglang.unregister()
    except Exception:  # noqa: BLE001  the adapter itself did not import: nothing was hooked
        pass
