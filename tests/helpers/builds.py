"""Builds of the kernel sources that only tests launch (through the ops' ``prepared`` hook)."""
import dataclasses
from nvrtc_gather.kernels import indexer_k_quant as quant_kernels


# The integer fp8 encoder that sm_80/86 use (cuda_src/fp8_e4m3.cuh), forced on every arch so
# that a newer GPU runs it too; every entry point of the write family in one build.
QUANT_SOFT_FP8 = dataclasses.replace(quant_kernels.MODULES["bf16", 16, ""], name="quant_cache_soft",
                                     entries=tuple(e for m in quant_kernels.MODULES.values() for e in m.entries),
                                     options=quant_kernels.OPTIONS + ("-DNG_SOFT_FP8=1",))
