"""Announcement lines an adapter logs once per process, kept until the engine's logging can
show them (vllm_log.py, sglang_log.py say when that is for each engine)."""
from __future__ import annotations

import os
import threading


class PendingLines:
    """Lines ``(level, msg, args)``, each logged at most once in each process: a forked process
    inherits the list and logs every line again there."""

    def __init__(self):
        self._lock = threading.Lock()
        self._lines: list[dict] = []  # {"level", "msg", "args", "pid": the process that logged it, or None}

    def add(self, level: int, msg: str, args: tuple) -> None:
        with self._lock:
            self._lines.append({"level": level, "msg": msg, "args": args, "pid": None})

    def pending(self) -> list[str]:
        """The lines not yet logged in this process, formatted."""
        pid = os.getpid()
        with self._lock:
            return [line["msg"] % line["args"] for line in self._lines if line["pid"] != pid]

    def take(self) -> list[tuple]:
        """The lines not yet logged in this process, ``(level, msg, args)``, marked as logged here."""
        pid = os.getpid()
        with self._lock:
            due = [line for line in self._lines if line["pid"] != pid]
            for line in due:
                line["pid"] = pid
        return [(line["level"], line["msg"], line["args"]) for line in due]
