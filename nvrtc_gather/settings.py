"""Settings from environment variables, each read when it is used (never at import),
so a process may change them at any time. All share the NVRTC_GATHER_ prefix."""
from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "NVRTC_GATHER_CACHE_DIR"
DISABLE_CACHE_ENV = "NVRTC_GATHER_DISABLE_CACHE"
DEBUG_ENV = "NVRTC_GATHER_DEBUG"
DISABLE_JIT_ENV = "NVRTC_GATHER_DISABLE_JIT"

_TRUE = {"1", "true", "yes", "on"}


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def cache_dir() -> Path:
    """Where compiled kernels are kept: $NVRTC_GATHER_CACHE_DIR, else the per-user
    XDG cache home (``$XDG_CACHE_HOME/nvrtc_gather`` or ``~/.cache/nvrtc_gather``).
    Always absolute (a relative value is taken from the current directory now), so a later
    chdir cannot move the cache; symlinks are kept (the cache judges their target)."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(os.path.abspath(Path(explicit).expanduser()))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return Path(os.path.abspath(base / "nvrtc_gather"))


def disk_cache_enabled() -> bool:
    """False when NVRTC_GATHER_DISABLE_CACHE is set to 1/true/yes/on: kernels then live in memory only."""
    return not _flag(DISABLE_CACHE_ENV)


def debug_enabled() -> bool:
    """NVRTC_GATHER_DEBUG=1: GPU kernels check their indices and the op raises on bad ones.
    This synchronises with the device after each call; for debugging only.
    Read on every op call, so it is kept to one dictionary lookup when unset."""
    return bool(os.environ.get(DEBUG_ENV)) and _flag(DEBUG_ENV)


def jit_disabled() -> bool:
    """NVRTC_GATHER_DISABLE_JIT=1: never compile in this process (a serving process whose cache
    was warmed); a kernel missing from the cache raises JitDisabledError instead."""
    return _flag(DISABLE_JIT_ENV)
