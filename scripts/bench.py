#!/usr/bin/env python3
"""Benchmark the gather against a device copy and the baselines: python scripts/bench.py OUT_DIR
(same as `nvrtc-gather bench OUT_DIR`). Needs a CUDA GPU."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from nvrtc_gather.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
