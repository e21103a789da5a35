"""The catalogue of kernel modules: which source file, which entry points, which options.

A module is compiled once per target arch into one cubin holding all its entry points.
New kernels plug in by adding a KernelModule here; compiling, caching, loading and
launching are shared (compiler.py, cache.py, registry.py, launcher.py)."""
from __future__ import annotations

from dataclasses import dataclass

# Must match NG_THREADS in cuda_src/common.cuh.
THREADS_PER_BLOCK = 256


@dataclass(frozen=True)
class KernelModule:
    name: str                    # short id, used in cache file names
    source: str                  # file in cuda_src/
    kernels: tuple[str, ...]     # extern "C" entry points
    options: tuple[str, ...] = ()  # extra NVRTC options (the arch is added per target)


GATHER = KernelModule(
    name="gather_indexer_k",
    source="gather_indexer_k.cu",
    kernels=tuple(f"gather_indexer_k_v{vec}{shape}" for shape in ("", "_wide", "_tiny") for vec in (16, 8, 4)),
)

# --fmad=false: no a*b+c contraction; --ftz=false: subnormals kept (the default, made explicit).
# Together they keep the kernel's fp32 arithmetic exactly the torch path's.
QUANT = KernelModule(
    name="quant_cache",
    source="quant_cache.cu",
    kernels=tuple(f"quant_cache_{t}_{v}" for t in ("bf16", "f16", "f32") for v in ("v16", "v8", "any")),
    options=("--fmad=false", "--ftz=false"),
)

# Every module the package can launch (the warmup tool compiles all of them).
ALL_MODULES: tuple[KernelModule, ...] = (GATHER, QUANT)

# Benchmark-only kernels (scripts/bench.py): compiled and launched through the same path,
# never by the ops, so not part of ALL_MODULES.
BASELINE_LINEAR_SCAN = KernelModule(
    name="baseline_linear_scan",
    source="baseline_linear_scan.cu",
    kernels=("baseline_linear_scan",),
)

# Benchmark-only builds of the quant module (nvrtc_gather/bench_quant.py times them against
# QUANT through the same compile, cache and launch path; tests/test_quant_gpu.py runs the
# integer fp8 encoder on a GPU through QUANT_SOFT_FP8). Distinct names: libraries are kept
# per module name and arch. -DNG_QUNROLL=N must be matched by the launch
# (quant_cache.launch_config(..., unroll=N)).
QUANT_SOFT_FP8 = KernelModule("quant_cache_soft", QUANT.source, QUANT.kernels, QUANT.options + ("-DNG_SOFT_FP8=1",))
BENCH_QUANT_VARIANTS: tuple[KernelModule, ...] = (
    KernelModule("quant_cache_u1", QUANT.source, QUANT.kernels, QUANT.options + ("-DNG_QUNROLL=1",)),
    KernelModule("quant_cache_u2", QUANT.source, QUANT.kernels, QUANT.options + ("-DNG_QUNROLL=2",)),
    KernelModule("quant_cache_u8", QUANT.source, QUANT.kernels, QUANT.options + ("-DNG_QUNROLL=8",)),
    KernelModule("quant_cache_narrow", QUANT.source, QUANT.kernels, QUANT.options + ("-DNG_QWIDE=0",)),
    QUANT_SOFT_FP8,
)

# Benchmark-only builds of the gather module (bench.py times them beside GATHER with
# --gather-variants, scripts/profile_gather.py under Nsight Compute; tests check them).
# Same parameters and grid as the op.
BENCH_GATHER_VARIANTS: tuple[KernelModule, ...] = (
    # the op's own build under another name: timing it beside the op measures the noise
    KernelModule("gather_indexer_k_control", GATHER.source, GATHER.kernels),
)

# Every benchmark-only module (e.g. for `nvrtc-gather cache list` to recognise their entries).
BENCH_MODULES: tuple[KernelModule, ...] = (BASELINE_LINEAR_SCAN,) + BENCH_QUANT_VARIANTS + BENCH_GATHER_VARIANTS
