"""Child-process bodies for test_cache_concurrency.py. A module of its own (not a test
file) so that forkserver children import it, and nvrtc_gather, without pytest."""
import hashlib
import json
import os
import time
from contextlib import contextmanager


def build_all(cache_dir, archs, barrier, out_path, use_lock=True, only=None):
    """Wait for every sibling, then build every module (or those named in ``only``) for
    ``archs``; write what happened."""
    from nvrtc_gather.jit import cubin_cache
    from nvrtc_gather.jit import compiler
    from nvrtc_gather.jit import build, runtime
    from nvrtc_gather import kernels
    from nvrtc_gather.kernels import gather as gather_kernels

    if not use_lock:  # correctness must not depend on the lock
        @contextmanager
        def no_lock(self, name, key, timeout=None):
            yield False
        cubin_cache.DiskCache.lock = no_lock
    disk = cubin_cache.DiskCache(cache_dir)
    barrier.wait(timeout=120)
    results = {}
    for arch in archs:
        for m in kernels.ALL_MODULES:
            if only is not None and m.name not in only:
                continue
            r = build.build_image(m, compiler.Target(arch), disk=disk)
            results[f"{m.name}-{arch}"] = hashlib.sha256(r.image).hexdigest()
    with open(out_path, "w") as f:
        json.dump({"compiles": build.stats["compiles"], "images": results}, f)


def stall_in_fsync(cache_dir, arch, inside):
    """Build one entry, but stop forever inside put()'s fsync (the parent SIGKILLs us there)."""
    from nvrtc_gather.jit import cubin_cache
    from nvrtc_gather.jit import compiler
    from nvrtc_gather.jit import build, runtime
    from nvrtc_gather import kernels
    from nvrtc_gather.kernels import gather as gather_kernels

    def stuck_fsync(fd):
        inside.set()
        time.sleep(600)
    os.fsync = stuck_fsync
    build.build_image(gather_kernels.MODULES[16], compiler.Target(arch), disk=cubin_cache.DiskCache(cache_dir))
