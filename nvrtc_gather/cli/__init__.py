"""The ``nvrtc-gather`` command (also ``python -m nvrtc_gather``).

Subcommands: demo, warmup, cache, info. (The benchmark is benchmarks/bench.py in a checkout.) Each lives in its own module; this file
only dispatches."""
from __future__ import annotations

import sys


def _demo(argv):
    from .demo import main
    return main(argv)


def _warmup(argv):
    from .warmup import main
    return main(argv)


def _cache(argv):
    from .cache import main
    return main(argv)


def _info(argv):
    from .info import main
    return main(argv)


COMMANDS = {
    "demo": (_demo, "gather a DeepSeek-V3.2-sized cache, check it, print throughput (CPU fallback)"),
    "warmup": (_warmup, "compile every kernel for --arch sm_90 ... / --all / the GPUs present into the disk cache"),
    "cache": (_cache, "list | verify [--fix] | clear the disk cache of compiled kernels"),
    "info": (_info, "versions (package, NVRTC, driver, torch), GPUs and their archs, cache state"),
}


def _usage(out) -> None:
    width = max(map(len, [*COMMANDS, "--version"]))
    out.write("usage: nvrtc-gather COMMAND [ARGS]   (nvrtc-gather COMMAND --help for its options)\n\ncommands:\n")
    for name, (_, doc) in COMMANDS.items():
        out.write(f"  {name:<{width}}  {doc}\n")
    out.write(f"  {'--version':<{width}}  print the version\n")


def escape_unprintable_output() -> None:
    """Print what the output encoding cannot hold (a cache path of undecodable bytes, kept as
    surrogates; ``caché`` under PYTHONIOENCODING=ascii) as backslash escapes instead of raising
    UnicodeEncodeError: every command prints paths it did not choose."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a closed or detached stream: nothing to protect
                pass


def main(argv=None) -> int:
    from . import output

    argv = list(sys.argv[1:] if argv is None else argv)
    escape_unprintable_output()
    stdout = sys.stdout
    output.guard()
    try:
        status = _dispatch(argv)
        sys.stdout.flush()
        return status
    except output.OutputError as exc:  # `>&-`, `> /dev/full`, `| head`: no traceback
        return output.report(exc)
    finally:
        sys.stdout = stdout


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] == "--version":
        if len(argv) > 1:
            sys.stderr.write(f"nvrtc-gather: --version takes no arguments, got {' '.join(argv[1:])!r}\n")
            return 2
        from .._version import __version__
        print(f"nvrtc-gather {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        _usage(sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        sys.stderr.write(f"nvrtc-gather: unknown command {argv[0]!r}\n")
        _usage(sys.stderr)
        return 2
    fn, _ = COMMANDS[argv[0]]
    from ..errors import CacheLocationError, InvalidSettingError, JitDisabledError
    try:
        return int(fn(argv[1:]) or 0)
    except (InvalidSettingError, CacheLocationError, JitDisabledError) as exc:  # the environment, not a bug: say what to set
        sys.stderr.write(f"nvrtc-gather {argv[0]}: error: {exc}\n")
        return 2

if __name__ == "__main__":
    sys.exit(main())
