"""``nvrtc-gather info``: what this install would use, for bug reports and for checking a
machine. Never raises and never prints a traceback: each probe that fails prints why
(e.g. "no NVIDIA driver found") and the others still run. Exit status 0."""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys

from .. import settings
from .._version import __version__, installed_version
from ..jit import cuda_packages
from .text import help_text, human_size


def _nvrtc(lines):
    from ..jit import compiler

    try:
        nv = compiler.nvrtc_version()
        archs = compiler.supported_archs()
    except Exception as exc:  # MissingDependencyError says what to install
        lines.append(("NVRTC", f"not usable: {exc}"))
        return None
    wheels = " and ".join(f"{d} {v}" for d, v in cuda_packages.nvrtc_wheels().values())
    lines.append(("NVRTC", f"{nv[0]}.{nv[1]}" + (f" (wheels: {wheels})" if wheels else " (not from a wheel)")))
    lines.append(("NVRTC archs", " ".join(f"sm_{a}" for a in archs)))
    return nv


def _driver(lines, notes, nv):
    from ..errors import CudaError, MissingDependencyError
    from ..jit import compiler, driver

    try:
        v = driver.driver_version()
        count = driver.device_count()
    except MissingDependencyError as exc:
        cause = exc.__cause__
        if isinstance(cause, CudaError) and cause.code == 100:
            lines.append(("driver", "NVIDIA driver found, but no GPU is visible (check CUDA_VISIBLE_DEVICES)"))
        else:
            lines.append(("driver", "no NVIDIA driver found"))
        return
    except Exception as exc:
        lines.append(("driver", f"not usable: {exc}"))
        return
    drv = (v // 1000, v % 1000 // 10)
    lines.append(("driver", f"CUDA {drv[0]}.{drv[1]} ({v})"))
    needs_ptx = False
    for i in range(count):
        try:
            cc = driver.capability(i)
            desc = f"{driver.device_name(i)}, sm_{cc}"
            if nv is not None:
                t = compiler.pick_target(cc)
                needs_ptx |= t.is_ptx
                desc += f" -> loads {t.arch} ({'PTX, JIT by the driver' if t.is_ptx else 'cubin'})"
        except Exception as exc:
            desc = f"not usable: {exc}"
        lines.append((f"GPU {i}", desc))
    if count == 0:
        lines.append(("GPUs", "none visible"))
    if nv is None:
        return
    if drv[0] < nv[0]:
        notes.append(f"NVRTC {nv[0]}.{nv[1]} is a newer major version than the driver (CUDA {drv[0]}.{drv[1]}): "
                     f"its kernels may not load. Upgrade the NVIDIA driver, or "
                     f"{cuda_packages.driver_match_hint(drv[0])}.")
    elif drv < nv:
        msg = (f"NVRTC {nv[0]}.{nv[1]} is newer than the driver (CUDA {drv[0]}.{drv[1]}): cubins load, PTX "
               "(used only for a GPU newer than NVRTC) does not.")
        if needs_ptx:
            msg += (f" A GPU here needs PTX: upgrade the NVIDIA driver, or "
                    f"{cuda_packages.driver_match_hint(drv[0], drv[1])}.")
        notes.append(msg)


def _torch(lines):
    try:
        import torch
    except Exception as exc:
        lines.append(("torch", f"not importable ({exc})"))
        return
    try:
        built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
        lines.append(("torch", f"{torch.__version__} ({built}; sees CUDA: "
                               f"{'yes' if torch.cuda.is_available() else 'no'})"))
    except Exception as exc:
        lines.append(("torch", f"{getattr(torch, '__version__', '?')} (CUDA query failed: {exc})"))


def _cache(lines):
    from ..jit.cubin_cache import MISSING, DiskCache

    try:
        d = settings.cache_dir()
    except Exception as exc:  # CacheLocationError: no home directory, a '~' that does not expand
        lines.append(("cache dir", f"unknown: {exc}"))
        lines.append(("cache", "not used: kernels are kept in memory"))
        return
    try:
        enabled = "enabled" if settings.disk_cache_enabled() else f"disabled by {settings.DISABLE_CACHE_ENV}"
    except Exception as exc:  # InvalidSettingError
        enabled = f"unknown ({exc})"
    problem = DiskCache(d).directory_problem()
    if problem == MISSING:
        state = "does not exist yet (created at first use)"
    else:
        state = f"not usable: {problem}" if problem else "usable"
    source = f"from ${settings.CACHE_DIR_ENV}" if os.environ.get(settings.CACHE_DIR_ENV) else "default"
    lines.append(("cache dir", f"{d} ({source})"))
    lines.append(("cache", f"{enabled}, {state}"))
    scan = DiskCache(d).scan(verify=False)
    if scan.error is None:
        lines.append(("cache files", f"{len(scan.images)} image(s), {human_size(sum(i.size for i in scan.images))} "
                                     "(check them: nvrtc-gather cache verify --arch ARCH)"))


def _bindings_vs_nvrtc(notes) -> None:
    """cuda-bindings of one CUDA major loads the NVRTC of its own major: an NVRTC wheel of
    another major alone (e.g. torch 2.8 with no extra: cuda-bindings 13 beside NVRTC 12.8)
    is silently not the one used, or not found at all."""
    bindings = cuda_packages.bindings_major()
    wheels = cuda_packages.nvrtc_wheels()
    if bindings is None or not wheels or bindings in wheels:
        return
    have = " and ".join(f"{d} {v}" for d, v in wheels.values())
    notes.append(f"cuda-bindings {installed_version('cuda-bindings')} is CUDA {bindings}, but the NVRTC wheel "
                 f"installed is {have}: CUDA {bindings}'s bindings do not use it. Install the matching pair, e.g. "
                 f"{cuda_packages.driver_match_hint(min(wheels))} (for torch's CUDA {min(wheels)}), or "
                 f"{cuda_packages.driver_match_hint(bindings)}.")


def _plugins(lines, notes, nv) -> None:
    """What the vLLM and SGLang plugins will do in an engine process of this environment (``info``
    runs in its own process: inside the engine, ``integrations.<engine>.status()`` says what was
    done); a warning where one is installed and on but NVRTC (``nv``: None) is not usable, and for
    an invalid ops list (a bad on/off switch is one of _variables' warnings already)."""
    from ..integrations import activation, sglang_activation

    def sglang_methods():
        return tuple(sglang_activation.OPS[op] for op in sglang_activation.sglang_ops())

    for label, group, enabled, ops, env, engine in (
            ("vLLM", "vllm.general_plugins", activation.vllm_enabled, activation.vllm_ops, activation.ENABLE_ENV,
             "vllm"),
            ("SGLang", "sglang.srt.plugins", sglang_activation.sglang_enabled, sglang_methods,
             sglang_activation.ENABLE_ENV, "sglang")):
        lines.append((f"{label} plugin", _plugin(label, group, enabled, ops, env, notes, nv, engine)))


def _plugin(label, group, enabled, ops, enable_env, notes, nv, engine) -> str:
    from importlib import metadata

    from ..errors import InvalidSettingError

    try:
        found = any(ep.name == "nvrtc_gather" for ep in metadata.entry_points(group=group))
    except Exception:
        found = False
    where = "entry point installed" if found else "entry point not installed (a checkout on PYTHONPATH?)"
    try:
        if not enabled():
            will = f"switched off by {enable_env}"
        else:
            will = "replaces " + ", ".join(ops()) + f" in {label} processes"
            if found and nv is None:
                notes.append(f"the {label} plugin is installed and on, but NVRTC is not usable here (see NVRTC above): "
                             f"{label}'s workers will fail at startup loading its kernels. Install NVRTC as the NVRTC "
                             f"line says, or set {enable_env}=0 to leave {label}'s own kernels in place.")
    except ValueError as exc:
        will = "INVALID setting"
        if not isinstance(exc, InvalidSettingError):
            notes.append(str(exc))
    return f"{where}; {will} (inside {label}: integrations.{engine}.status())"


def _variables(lines, notes) -> None:
    for name, state in settings.describe():
        lines.append((name, state))
        if "INVALID" in state:  # the message the setting raises with where it is read
            try:
                settings.parse_flag(name, os.environ.get(name))
            except ValueError as exc:
                notes.append(str(exc))


def collect() -> tuple[list[tuple[str, str]], list[str]]:
    """(label, value) lines and warnings about version mismatches and settings. Never raises."""
    lines: list[tuple[str, str]] = [
        ("nvrtc-gather", f"{__version__} ({os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})"),
        ("python", f"{platform.python_version()} ({sys.executable})"),
    ]
    notes: list[str] = []
    nv = _nvrtc(lines)
    lines.append(("cuda-bindings", installed_version("cuda-bindings") or "not installed"))
    _bindings_vs_nvrtc(notes)
    _driver(lines, notes, nv)
    _torch(lines)
    _cache(lines)
    _plugins(lines, notes, nv)
    _variables(lines, notes)
    return lines, notes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="nvrtc-gather info", description=help_text(__doc__))
    p.add_argument("--json", action="store_true",
                   help='one JSON object: {"info": {label: value, ...}, "warnings": [...]}')
    args = p.parse_args(argv)
    lines, notes = collect()
    if args.json:
        print(json.dumps({"info": dict(lines), "warnings": notes}, indent=1))
        return 0
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k:<{width}}  {v}")
    for n in notes:
        print(f"warning: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
