"""Where the SGLang read's host cost goes, piece by piece (issue 34: the read 2.15x torch's
``copy_``, the hooked read 2.37x, target 2x; the pieces' sum on the CPU machine did not explain
the H100 host's total: NOTES v22).

    python3 benchmarks/experiments/host_breakdown.py          # CUDA: the real driver and allocator
    python3 benchmarks/experiments/host_breakdown.py fake     # no GPU: CPU tensors planned as cuda:0,
                                                              # the C stand-in driver (tests/helpers)

Each piece is timed as the bench times host cost (timing.host_costs: bursts of 250 calls,
interleaved, median), beside ``copy_`` on CUDA. Pieces: the read and the hooked read (SGLang's
``GetKAndS.execute`` patched as register() does: SGLang's own class where it imports, else a
stand-in with its signature), the layout key alone and with its lookup, the two output
allocations, the last-slot check that stands for them (ops/fast_path.py), the read's ``_run``
(allocations and launch), its launcher alone, and the driver's
launch of the same kernel and parameters through ctypes: ``cuLaunchKernelEx`` (what the launcher
calls) and ``cuLaunchKernel`` (11 arguments, for comparison)."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from nvrtc_gather.integrations import sglang as sg  # noqa: E402
from nvrtc_gather.jit import driver, runtime, spec  # noqa: E402
from nvrtc_gather.ops import index_k_read  # noqa: E402

BATCH, LENGTH, PAGES = 8, 100, 2


def use_fake_driver() -> None:
    """The C stand-in libcuda, the primary context current, every module 'loaded', the read's
    plan on cuda:0: the whole host path runs on CPU tensors and launches into the stand-in."""
    cc = shutil.which("cc") or shutil.which("gcc")
    lib = Path(tempfile.mkdtemp()) / "fake_libcuda.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", str(ROOT / "tests/helpers/fake_libcuda.c"), "-o", str(lib)],
                   check=True)
    driver.LIBRARY = str(lib)
    ctypes.CDLL(str(lib)).fake_set_current(ctypes.c_void_p(driver.primary_context(0)))
    runtime.current_stream = lambda device: 0  # torch's C getter where CUDA exists (~0.1 µs)
    for module in spec.registered():
        runtime._loaded[module.name, 0] = runtime.LoadedModule(
            module, 0, {name: 0x5000 + i for i, name in enumerate(module.kernels)})
    real = index_k_read.plan_read
    index_k_read.plan_read = lambda *a: real(*a)._replace(device=0)


class Pool:  # SGLang's DSA token-to-KV pool: the attributes the hook reads
    index_page_size = page_size = 64
    index_head_dim = quant_block_size = 128


class GetKAndS:  # SGLang 0.5.23's accessor class, its signature
    @classmethod
    def execute(cls, *args, **kwargs):
        raise AssertionError("SGLang's own read ran: the hook did not serve the call")


def hooked_accessor():
    try:
        import engine_entries
        acc = engine_entries.accessor()
    except Exception:  # noqa: BLE001  no SGLang here: the stand-in
        acc = None
    if acc is not None:
        sg.register()
        return acc.GetKAndS, engine_entries.pool(), "SGLang's GetKAndS"
    sg._patch(GetKAndS, sg._get_hook)
    return GetKAndS, Pool(), "a stand-in GetKAndS"


def raw_launches(layout, buf, lens, pages, n: int) -> dict:
    """The driver's launch of the read's kernel with this call's parameters, through ctypes."""
    vec = layout.widths[buf.data_ptr() & 15]
    tpc, shape, grid = layout.launch(n, LENGTH)
    function = runtime.load(index_k_read.spec.MODULES[(vec, *layout.types)], 0).functions[
        index_k_read.spec.entry_name(vec, *layout.types, shape, layout.fixed)]
    k, s = buf.new_empty(n, 128), buf.new_empty(n, 4)
    params = ctypes.create_string_buffer(layout.image.template, len(layout.image.template))
    layout.image.pack_pointers(params, 0, buf.data_ptr(), k.data_ptr(), s.data_ptr(), lens.data_ptr(),
                               pages.data_ptr(), n, tpc)
    arr = (ctypes.c_void_p * 1)(ctypes.addressof(params))
    stream = runtime.current_stream(0)
    cfg = driver.LaunchConfig(grid, 1, 1, 256, 1, 1, 0, stream, None, 0)
    lib = ctypes.CDLL(driver.LIBRARY)  # the library driver.py binds (its own argtypes on its handle)
    ex, plain = lib.cuLaunchKernelEx, getattr(lib, "cuLaunchKernel", None)
    ex.restype, ex.argtypes = ctypes.c_int, [ctypes.c_void_p] * 4
    cfg_p, arr_p = ctypes.addressof(cfg), ctypes.addressof(arr)

    def launch_ex(_keep=(k, s, params, arr, cfg)):  # what the pointers point into outlives the lambda
        return ex(cfg_p, function, arr_p, None)
    out = {"driver: cuLaunchKernelEx": (launch_ex, ())}
    if plain is not None:  # the stand-in driver has none
        plain.restype = ctypes.c_int
        plain.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        out["driver: cuLaunchKernel"] = (lambda: plain(function, grid, 1, 1, 256, 1, 1, 0, stream, arr_p, None), ())
    return out


def _sliced(flat, n):
    return flat[:n * 128].view(n, 128), flat[n * 128:].view(n, 4)


def _strided(flat, n):
    return flat.as_strided((n, 128), (128, 1)), flat.as_strided((n, 4), (4, 1), n * 128)


def _split(flat, n):
    k, s = flat.split_with_sizes((n * 128, n * 4))
    return k.view(n, 128), s.view(n, 4)


def calls(device: str) -> dict:
    n = BATCH * LENGTH
    buf = torch.zeros(100, 64 * 132, dtype=torch.uint8, device=device)
    lens = torch.full((BATCH,), LENGTH, dtype=torch.int64, device=device)  # int64 and int32 ids: SGLang's
    pages = torch.arange(BATCH * PAGES, dtype=torch.int32, device=device).view(BATCH, PAGES).contiguous()
    sizes = (64, 128, 128)
    sg.get_index_k_scale_buffer(buf, lens, pages, n, LENGTH)  # the layout remembered
    key = index_k_read._key(buf, lens, pages, *sizes)
    layout = index_k_read._layouts.get(key)
    assert layout is not None, "the read did not remember its layout"
    go = next(iter(layout.launchers.values()))
    k, s = buf.new_empty(n, 128), buf.new_empty(n, 4)
    tpc, _, grid = layout.launch(n, LENGTH)
    pointers = (buf.data_ptr(), k.data_ptr(), s.data_ptr(), lens.data_ptr(), pages.data_ptr(), n, tpc)
    cls, pool, which = hooked_accessor()
    print("hooked read through", which)
    out = {
        "read": (sg.get_index_k_scale_buffer, (buf, lens, pages, n, LENGTH)),
        "hooked read": (lambda: cls.execute(pool, buf, page_indices=pages, seq_len_tensor=lens, seq_len_sum=n,
                                            max_seq_len=LENGTH), ()),
        "key": (index_k_read._key, (buf, lens, pages, *sizes)),
        "key and lookup": (lambda: index_k_read._layouts.get(index_k_read._key(buf, lens, pages, *sizes)), ()),
        "last-slot check": (index_k_read._layouts.last[0], (buf, lens, pages)),
        "two allocations": (lambda: (buf.new_empty(n, 128), buf.new_empty(n, 4)), ()),
        # the same two outputs (contiguous, rows n) carved from one allocation: what a single
        # allocation would save the read. Measured (H100 host, NOTES v38): 5.98-10.70 us against
        # the two allocations' 4.86: none saves anything
        "one allocation, two slices": (lambda: _sliced(buf.new_empty(n * 132), n), ()),
        "one allocation, two as_strided": (lambda: _strided(buf.new_empty(n * 132), n), ()),
        "one allocation, split_with_sizes": (lambda: _split(buf.new_empty(n * 132), n), ()),
        "_run (allocations, launch)": (index_k_read._run, (layout, buf, lens, pages, n, LENGTH)),
        "launcher": (lambda: go(pointers, 0, grid), ()),
    }
    out.update(raw_launches(layout, buf, lens, pages, n))
    if device == "cuda":
        a, b = torch.empty(1024, device="cuda"), torch.empty(1024, device="cuda")
        out = {"torch copy_": (a.copy_, (b,)), **out}
    return out


def main(mode: str = "cuda") -> None:
    from timing import host_costs
    if mode == "fake":
        use_fake_driver()
        sync = lambda: None  # noqa: E731
    else:
        sync = torch.cuda.synchronize
        print(torch.cuda.get_device_name(), torch.__version__)
    fns = calls("cpu" if mode == "fake" else "cuda")
    t0 = time.perf_counter()
    got = host_costs(fns, 10000, sync=sync)
    base = got.get("torch copy_")
    for name, us in got.items():
        print(f"{name:30s} {us:7.3f} µs" + (f"  {us / base:5.2f}x copy_" if base else ""))
    print(f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main(*sys.argv[1:])
