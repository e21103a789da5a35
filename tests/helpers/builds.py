"""Builds of the kernel sources that only tests launch (through the ops' ``prepared`` hook)."""
import dataclasses

from nvrtc_gather.jit import catalogue

# The integer fp8 encoder that sm_80/86 use (cuda_src/fp8_e4m3.cuh), forced on every arch so
# that a newer GPU runs it too; every k dtype in one build (no -DNG_QUANT_K).
QUANT_SOFT_FP8 = dataclasses.replace(catalogue.QUANT, name="quant_cache_soft",
                                     kernels=tuple(catalogue.QUANT_ENTRIES.values()),
                                     options=catalogue.QUANT_OPTIONS + ("-DNG_SOFT_FP8=1",))
