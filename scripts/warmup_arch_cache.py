#!/usr/bin/env python3
"""Compile every kernel into the disk cache ahead of time, no GPU needed:
python scripts/warmup_arch_cache.py --arch sm_90 sm_100 [--cache-dir DIR]
(same as `nvrtc-gather warmup ...`; --all for every arch NVRTC supports)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from nvrtc_gather.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["warmup", *sys.argv[1:]]))
