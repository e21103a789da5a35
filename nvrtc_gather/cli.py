"""The ``nvrtc-gather`` command (also ``python -m nvrtc_gather``).

Subcommands: demo, bench. Each lives in its own module; this file only dispatches."""
from __future__ import annotations

import sys


def _demo(argv):
    from .demo import main
    return main(argv)


def _bench(argv):
    from .bench import main
    return main(argv)


COMMANDS = {
    "demo": (_demo, "gather a DeepSeek-V3.2-sized cache, check it, print throughput (CPU fallback)"),
    "bench": (_bench, "side-by-side GPU benchmark: op, copy ceiling, baselines (needs a GPU)"),
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        print("usage: nvrtc-gather COMMAND [ARGS]\n\ncommands:")
        for name, (_, doc) in COMMANDS.items():
            print(f"  {name:<{width}}  {doc}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    fn, _ = COMMANDS[argv[0]]
    return int(fn(argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
