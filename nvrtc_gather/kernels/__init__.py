"""Kernel families: for each CUDA C source in cuda_src/, its spec (parameter struct, modules,
entry points, grid and tile policy), torch-free. Importing this package registers every
module with the JIT (jit/spec.py), which warmup and preload read.

A new family is one module here (its spec), one ``.cu`` (and its ``*_params.cuh``) in
cuda_src/, and one op module in nvrtc_gather/ops/; docs/architecture.md walks through it."""
from . import cache_gather, dsv4_gather, gather, index_k_read, indexer_k_quant, indexer_k_scatter, mla_cache  # noqa: F401  (each registers its modules)
from ..jit.spec import registered

ALL_MODULES = registered()
