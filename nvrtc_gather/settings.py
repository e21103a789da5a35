"""Settings from environment variables, each read when it is used (never at import),
so a process may change them at any time. All share the NVRTC_GATHER_ prefix.

Boolean variables are read strictly: 1/true/yes/on and 0/false/no/off (any case, spaces
ignored; empty or unset means false); any other value raises InvalidSettingError naming the
variable, since a switch such as NVRTC_GATHER_DISABLE_JIT exists to fail loudly."""
from __future__ import annotations

import os
from pathlib import Path

from .errors import CacheLocationError, InvalidSettingError

CACHE_DIR_ENV = "NVRTC_GATHER_CACHE_DIR"
DISABLE_CACHE_ENV = "NVRTC_GATHER_DISABLE_CACHE"
DEBUG_ENV = "NVRTC_GATHER_DEBUG"
DISABLE_JIT_ENV = "NVRTC_GATHER_DISABLE_JIT"
VLLM_ENV = "NVRTC_GATHER_VLLM"
VLLM_OPS_ENV = "NVRTC_GATHER_VLLM_OPS"
SGLANG_ENV = "NVRTC_GATHER_SGLANG"
SGLANG_OPS_ENV = "NVRTC_GATHER_SGLANG_OPS"

# Every variable the package reads, with what it does (``nvrtc-gather info`` lists them).
VARIABLES = {
    CACHE_DIR_ENV: "kernel cache directory (default: $XDG_CACHE_HOME/nvrtc_gather or ~/.cache/nvrtc_gather)",
    DISABLE_CACHE_ENV: "boolean: keep kernels in memory only",
    DISABLE_JIT_ENV: "boolean: never compile; a kernel missing from the cache raises JitDisabledError",
    DEBUG_ENV: "boolean: kernels check their indices, the op raises on bad ones (one sync per call)",
    VLLM_ENV: "boolean, default on: the vLLM plugin replaces vLLM's cache ops (integrations/vllm.py)",
    VLLM_OPS_ENV: "which of vLLM's ops the plugin replaces, comma-separated: gather, quant, mla_write, mla_gather, "
                  "cp_gather, dequant_gather, dsv4_gather (unset or empty: all seven)",
    SGLANG_ENV: "boolean, default on: the SGLang plugin hooks SGLang's index-K accessor and DeepSeek-V4 gathers "
                "(integrations/sglang_plugin.py)",
    SGLANG_OPS_ENV: "which of SGLang's functions the plugin hooks, comma-separated: get, set, dsv4_bf16, dsv4_fp8 "
                    "(empty or unset: all)",
}
BOOLEAN_VARIABLES = (DISABLE_CACHE_ENV, DISABLE_JIT_ENV, DEBUG_ENV, VLLM_ENV, SGLANG_ENV)
_DEFAULT_ON = (VLLM_ENV, SGLANG_ENV)

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def parse_flag(name: str, value: str | None) -> bool:
    """The boolean ``value`` of variable ``name`` (None: unset, false). Raises
    InvalidSettingError for anything but the spellings in the module docstring."""
    if value is None:
        return False
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InvalidSettingError(
        f"{name}={value!r} is not a boolean: set it to 1, true, yes or on (or 0, false, no, off), or unset it")


def flag(name: str) -> bool:
    return parse_flag(name, os.environ.get(name))


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """Where compiled kernels are kept: ``override`` (a CLI's --cache-dir), else
    $NVRTC_GATHER_CACHE_DIR, else the per-user XDG cache home (``$XDG_CACHE_HOME/nvrtc_gather``
    or ``~/.cache/nvrtc_gather``). An empty ``override`` or variable counts as unset, alike for
    the option and the variables; a relative $XDG_CACHE_HOME is ignored (the XDG spec's rule).
    Always absolute (a relative value is taken from the current directory now), so a later
    chdir cannot move the cache; symlinks are kept (the cache judges their target). Raises
    CacheLocationError when a ``~`` cannot be expanded or this user has no home directory (a
    $HOME that is not an absolute path, or no $HOME and no passwd entry)."""
    if override is not None and os.fspath(override) != "":
        return Path(os.path.abspath(_expand(Path(override), "--cache-dir")))
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(os.path.abspath(_expand(Path(explicit), CACHE_DIR_ENV)))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = _expand(Path(xdg), "XDG_CACHE_HOME") if xdg else None
    if base is None or not base.is_absolute():
        base = _home() / ".cache"
    return Path(os.path.abspath(base / "nvrtc_gather"))


def _home() -> Path:
    """$HOME when it is an absolute path; without $HOME, this user's passwd entry."""
    home = os.environ.get("HOME")
    if home is not None:
        if os.path.isabs(home):
            return Path(home)
        raise CacheLocationError(
            f"HOME={home!r} is not an absolute path, so there is no home directory to put the kernel cache in; "
            f"set HOME to one, or {CACHE_DIR_ENV} to a private writable directory")
    import pwd

    try:
        return Path(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        raise CacheLocationError(
            f"no home directory to put the kernel cache in (uid {os.getuid()} has no $HOME and no passwd entry); "
            f"set {CACHE_DIR_ENV} to a private writable directory") from None


def _expand(path: Path, what: str) -> Path:
    try:
        return path.expanduser()
    except (RuntimeError, KeyError, OSError) as exc:
        raise CacheLocationError(f"{what}={str(path)!r}: cannot expand '~' ({exc}); "
                                 "give an absolute path") from None


def disk_cache_enabled() -> bool:
    """False when NVRTC_GATHER_DISABLE_CACHE is true: kernels then live in memory only."""
    return not flag(DISABLE_CACHE_ENV)


# How os.environ stores DEBUG_ENV in its dict (bytes on POSIX, upper case on Windows).
_DEBUG_KEY = os.environ.encodekey(DEBUG_ENV) if hasattr(os.environ, "encodekey") else None


def debug_unset_test() -> tuple:
    """``(data, key)``: while ``data is not None and key not in data``, NVRTC_GATHER_DEBUG is
    unset and debug_enabled() is False. The launcher binds the pair once and tests it inline
    on every launch (a Python call less); ``data`` is None where os.environ has no such dict."""
    return getattr(os.environ, "_data", None), _DEBUG_KEY


def debug_enabled() -> bool:
    """NVRTC_GATHER_DEBUG=1: GPU kernels check their indices and the op raises on bad ones.
    This synchronises with the device after each call; for debugging only.
    Read on every op call, so the usual case (unset) is one lookup in os.environ's own dict:
    os.environ.get raises and catches a KeyError inside for an unset variable (~1 µs)."""
    data, key = debug_unset_test()
    if data is not None and key not in data:
        return False
    value = os.environ.get(DEBUG_ENV)
    return bool(value) and parse_flag(DEBUG_ENV, value)


def jit_disabled() -> bool:
    """NVRTC_GATHER_DISABLE_JIT=1: never compile in this process (a serving process whose cache
    was warmed); a kernel missing from the cache raises JitDisabledError instead."""
    return flag(DISABLE_JIT_ENV)


def describe() -> list[tuple[str, str]]:
    """(variable, state) for every NVRTC_GATHER_* variable, for ``nvrtc-gather info``: its
    value and meaning, or why the value is refused. Never raises."""
    rows = []
    for name, meaning in VARIABLES.items():
        value = os.environ.get(name)
        shown = "unset" if value is None else repr(value)
        if name in BOOLEAN_VARIABLES:
            try:
                on = parse_flag(name, value) if value is not None or name not in _DEFAULT_ON else True
                shown += " (on)" if on else " (off)"
            except InvalidSettingError:
                shown += " (INVALID: not a boolean; raises InvalidSettingError where it is read)"
        rows.append((name, f"{shown}: {meaning}"))
    others = sorted(n for n in os.environ if n.startswith("NVRTC_GATHER_") and n not in VARIABLES)
    rows += [(n, f"{os.environ[n]!r}: not a variable nvrtc_gather reads (a typo?)") for n in others]
    return rows
