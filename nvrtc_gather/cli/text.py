"""Plain-text output for the CLI commands (warmup, cache, info): sizes, tables, a progress
bar. No dependency beyond the standard library."""
from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from typing import Iterator, Sequence, TextIO


def help_text(doc: str, first_line_only: bool = False) -> str:
    """A module docstring's first paragraph (or line) as --help shows it: plain text, without
    the reStructuredText backquotes the docstring keeps for the API docs."""
    head = doc.split("\n")[0] if first_line_only else doc.split("\n\n")[0]
    return head.replace("``", "").replace("`", "")


def human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], out: TextIO | None = None) -> None:
    """Left-aligned columns, two spaces apart, a rule under the headers."""
    out = out or sys.stdout
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out.write("\n".join(lines) + "\n")


class Progress:
    """``[#####.....] 3/12 label`` on stderr: redrawn in place on a terminal, one line per
    step otherwise (build logs), nothing when disabled."""

    def __init__(self, total: int, enabled: bool = True, out: TextIO | None = None, width: int = 30):
        self.total, self.done, self.width = total, 0, width
        self.out = out or sys.stderr
        self.enabled = enabled and total > 0
        self.tty = self.enabled and getattr(self.out, "isatty", lambda: False)()
        self._last = 0

    def step(self, label: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        filled = self.width * self.done // self.total
        line = f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {label}".rstrip()
        if self.tty:
            self.out.write("\r" + line.ljust(self._last))
            self._last = len(line)
        else:
            self.out.write(line + "\n")
        self.out.flush()

    def close(self) -> None:
        if self.tty:
            self.out.write("\r" + " " * self._last + "\r")
            self.out.flush()


@contextmanager
def collected_warnings() -> Iterator[list[str]]:
    """The package's WARNING log records (e.g. a cache falling back to memory) collected
    instead of printed, so a command can print them after its own output, once each."""
    logger = logging.getLogger("nvrtc_gather")
    messages: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    handler, propagate = _Collect(logging.WARNING), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
