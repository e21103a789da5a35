"""The JIT: CUDA C sources to GPU code by NVRTC (compiler.py), kept in the cubin cache
(cubin_cache.py) under a key of everything that shapes it (build.py), loaded and launched
on a device (runtime.py, driver.py). spec.py says what a kernel module is and holds the
registry of the modules the package ships; the kernel families' specs themselves live in
nvrtc_gather/kernels/. Nothing here knows about the ops. See docs/architecture.md."""
