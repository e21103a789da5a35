"""The JIT: CUDA C sources to GPU code by NVRTC (compiler.py), kept in the cubin cache
(cubin_cache.py) under a key of everything that shapes it (build.py), loaded and launched
on a device (runtime.py, driver.py). The catalogue (catalogue.py) names every kernel module;
nothing here knows about the ops. See docs/architecture.md."""
