"""The commands' standard output when it cannot be written: closed (``>&-``), a full device
(``> /dev/full``), a reader that left (``| head``). Every write to stdout goes through
:class:`GuardedStdout`, which turns the failure into :class:`OutputError`; ``cli.main`` then
ends the command with one line on stderr and exit status 1 (nothing on stderr for a reader that
left, as coreutils do, or where stderr cannot be written either). No traceback."""
from __future__ import annotations

import errno
import os
import sys


class OutputError(Exception):
    """Standard output could not be written; ``cause`` is the OSError."""

    def __init__(self, cause: OSError):
        super().__init__(str(cause))
        self.cause = cause


class GuardedStdout:
    """``sys.stdout`` as the commands see it: writes and flushes that fail raise OutputError;
    everything else is the stream's. A closed stdout (``sys.stdout is None``) fails every write."""

    def __init__(self, stream):
        self._stream = stream

    def _fail(self, exc: OSError):
        raise OutputError(exc) from None

    def write(self, text: str) -> int:
        if self._stream is None:
            self._fail(OSError(errno.EBADF, "standard output is closed"))
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._fail(exc)

    def flush(self) -> None:
        if self._stream is None:
            return
        try:
            self._stream.flush()
        except OSError as exc:
            self._fail(exc)

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _devnull_on(fd: int) -> None:
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    except OSError:
        pass


def guard() -> None:
    """Route ``sys.stdout`` through GuardedStdout. A closed fd 1 gets /dev/null, so that no file
    the command opens becomes fd 1 (``sys.stdout`` stays None: writes still fail)."""
    if sys.stdout is None:
        try:
            os.fstat(1)
        except OSError:
            _devnull_on(1)
    sys.stdout = GuardedStdout(sys.stdout)


def report(exc: OutputError) -> int:
    """Say (on stderr, where it can) that stdout failed; put /dev/null under the real stdout so
    that the interpreter's own flush at exit has nothing to complain about. The exit status."""
    stream = sys.__stdout__
    if stream is not None:
        try:
            _devnull_on(stream.fileno())
        except (OSError, ValueError):
            pass
    if exc.cause.errno != errno.EPIPE:  # a reader that left is not an error to report
        try:
            if sys.stderr is not None:
                sys.stderr.write(f"nvrtc-gather: error: cannot write to standard output: {exc.cause.strerror or exc}\n")
                sys.stderr.flush()
        except (OSError, ValueError):  # stderr is gone too: silent, like coreutils
            pass
    return 1
