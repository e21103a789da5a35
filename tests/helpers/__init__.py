"""Shared test helpers: references, the kernels' host emulator, cache worker processes."""
