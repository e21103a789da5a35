"""The DeepSeek-V4 reference (tests/helpers/dsv4_reference.py) against the engines' own Triton
kernels, run on CPU by the Triton interpreter (TRITON_INTERPRET=1): SGLang 0.5.23's
``dequant_k_cache.py`` (its wrappers and kernels, every layout) and vLLM 0.33.0's Triton fallback of
``dequantize_and_gather_k_cache``. Compared byte for byte.

The engine files are loaded from the installed packages without importing them (their imports pull
in the whole engine): SGLang's module runs with its four ``sglang`` imports replaced by stand-ins
(KVLayout from its own kv_layout.py, CUDA arch 10.0, not HIP, not fnuz); vLLM's kernel function is
cut out of ``DequantizeAndGatherKCacheKernel`` and launched with the arguments of its ``__call__``
(cache_utils.py:481-496).

Where the interpreter's float conversions differ from the GPU's (docs/dsv4_engines.md §5: fp32 -> bf16
truncates, fp8 casts neither round to even nor saturate, numpy exp2 does not flush 2^-127), the
inputs are chosen so that no rounding happens: UE8M0 bytes 16..240 for the bf16 forms, values
exactly representable in e4m3 for the fp8 form. The fp4 layouts round nowhere, so they take any
bytes."""
from __future__ import annotations

import ast
import importlib.util
import os
import sys
import tempfile
import textwrap
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import dsv4_reference as R


def _engine_file(package: str, rel: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / rel
    return p if p.is_file() else None


try:
    import triton  # noqa: F401
    import triton.language  # noqa: F401
    _TRITON = None
except Exception as e:  # noqa: BLE001
    _TRITON = f"triton is not importable ({type(e).__name__}: {e}); the interpreter needs triton and numpy"

SGL_DEQUANT = _engine_file("sglang", "kernels/ops/attention/dsv4/dequant_k_cache.py")
SGL_LAYOUT = _engine_file("sglang", "kernels/ops/attention/dsv4/kv_layout.py")
VLLM_CACHE_UTILS = _engine_file("vllm", "models/deepseek_v4/common/ops/cache_utils.py")

needs_sglang = pytest.mark.skipif(
    _TRITON is not None or SGL_DEQUANT is None or SGL_LAYOUT is None,
    reason=_TRITON or "SGLang (>= 0.5.23, with sglang/kernels/ops/attention/dsv4/dequant_k_cache.py) is not installed",
)
needs_vllm = pytest.mark.skipif(
    _TRITON is not None or VLLM_CACHE_UTILS is None,
    reason=_TRITON or "vLLM (with vllm/models/deepseek_v4/common/ops/cache_utils.py, 0.22+) is not installed",
)


def _load_file_module(name: str, source: str, stubs: dict, interpret: bool = True) -> types.ModuleType:
    """Import ``source`` (an engine file's text, written to a private temp dir) as module ``name``, with
    ``stubs`` predefined; triton.jit reads the source back from the file, so it is a real file."""
    tmp = Path(tempfile.mkdtemp(prefix="dsv4_engine_")) / f"{name}.py"
    tmp.write_text(source)
    spec = importlib.util.spec_from_file_location(name, tmp)
    mod = importlib.util.module_from_spec(spec)
    mod.__dict__.update(stubs)
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"  # triton.jit picks the interpreter when decorating
    try:
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old
    return mod


@pytest.fixture(scope="module")
def sgl():
    return load_sglang(interpret=True)


def load_sglang(interpret: bool) -> types.ModuleType:
    """SGLang's dequant_k_cache.py with its sglang imports stubbed; ``interpret=False``: compiled
    for the GPU (tests/gpu/test_dsv4_gather_gpu.py)."""
    kvl_src = SGL_LAYOUT.read_text()
    kvl = _load_file_module("_dsv4_sgl_kv_layout", kvl_src, {}, interpret)
    src = SGL_DEQUANT.read_text()
    lines = src.splitlines(keepends=True)
    for node in ast.parse(src).body:                # blank out `from sglang... import ...` (keep line numbers)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang"):
            for i in range(node.lineno - 1, node.end_lineno):
                lines[i] = "\n"
    stubs = {
        "KVLayout": kvl.KVLayout,
        "get_jit_cuda_arch": lambda: types.SimpleNamespace(major=10, minor=0),
        "is_hip_runtime": lambda: False,
        "is_fp8_fnuz": lambda: False,
        "is_gfx95_supported": lambda: False,
    }
    return _load_file_module("_dsv4_sgl_dequant", "".join(lines), stubs, interpret)


@pytest.fixture(scope="module")
def vllm_kernel():
    src = VLLM_CACHE_UTILS.read_text()
    tree = ast.parse(src)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DequantizeAndGatherKCacheKernel")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "kernel")
    lines = src.splitlines(keepends=True)
    body = textwrap.dedent("".join(lines[fn.lineno - 1:fn.end_lineno]))   # the def, without decorators
    mod_src = "import triton\nimport triton.language as tl\n\n\n@triton.jit\n" + body
    mod = _load_file_module("_dsv4_vllm_kernel", mod_src, {})
    return mod.kernel


def _vllm_launch(kernel, out, k_cache, seq_lens, gather_lens, block_table, block_size, offset):
    """vLLM 0.33.0 DequantizeAndGatherKCacheKernel.__call__ (cache_utils.py:481-496) and kernel order (249-270)."""
    num_reqs = seq_lens.shape[0]
    kernel[(num_reqs, 128)](
        out, out.stride(0), out.stride(1), k_cache, seq_lens, block_table, offset, gather_lens,
        max_blocks_per_seq=block_table.shape[-1], fp8_dim=448, bf16_dim=64, scale_dim=8, quant_block=64,
        cache_block_size=block_size, token_data_size=576, block_stride=k_cache.stride(0), output_dim=512,
        fp8_max=448.0, n_quant_blocks=7, use_fnuz=False,
    )


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy()


# --- SGLang -------------------------------------------------------------------------------------

@needs_sglang
@pytest.mark.parametrize("page_size,n,id_dtype", [(64, 37, torch.int64), (16, 9, torch.int32), (2, 6, torch.int64)])
def test_sglang_v4_bf16(sgl, page_size, n, id_dtype):
    cache = R.build_cache("v4", 6, page_size, seed=page_size, scale_range=(16, 240))
    ids = R.random_token_ids(6, page_size, n, seed=page_size, dtype=id_dtype)
    got = sgl.dequantize_k_cache_paged_dsv4(cache, ids, page_size)
    want = R.dequantize_k_cache_paged_dsv4(cache, ids, page_size)
    assert got.shape == (n, 1, 512) and got.dtype == torch.bfloat16
    assert np.array_equal(_bytes(got), _bytes(want))


@needs_sglang
def test_sglang_v4_bf16_into_workspace_slice(sgl):
    page_size, n = 64, 11
    cache = R.build_cache("v4", 3, page_size, seed=7, scale_range=(16, 240))
    ids = R.random_token_ids(3, page_size, n, seed=7)
    ws_got = torch.full((n + 5, 1, 512), 3.0, dtype=torch.bfloat16)
    ws_want = ws_got.clone()
    sgl.dequantize_k_cache_paged_dsv4(cache, ids, page_size, out=ws_got[2:2 + n], layout="v4")
    R.dequantize_k_cache_paged_dsv4(cache, ids, page_size, out=ws_want[2:2 + n], layout="v4")
    assert np.array_equal(_bytes(ws_got), _bytes(ws_want))      # rows 0-1 and n+2.. untouched by both


@needs_sglang
@pytest.mark.parametrize("layout", ["v41", "v41_new", "v41_fp4", "v41_fp4_new"])
@pytest.mark.parametrize("page_size", [64, 4])
def test_sglang_v41_bf16(sgl, layout, page_size):
    n = 13
    cache = R.build_cache(layout, 5, page_size, seed=page_size + len(layout), scale_range=(16, 240))
    ids = R.random_token_ids(5, page_size, n, seed=3)
    got = sgl.dequantize_k_cache_paged_dsv4(cache, ids, page_size, layout=layout)
    want = R.dequantize_k_cache_paged_dsv4(cache, ids, page_size, layout=layout)
    assert np.array_equal(_bytes(got), _bytes(want))


@needs_sglang
@pytest.mark.parametrize("extra_rows,given_out", [(0, False), (1, False), (3, True)])
def test_sglang_v4_fp8_requant(sgl, extra_rows, given_out):
    page_size, n = 64, 29
    cache = R.build_cache("v4", 4, page_size, seed=11 + extra_rows, scale_range=(124, 130), exact_fp8=True)
    ids = R.random_token_ids(4, page_size, n, seed=5)
    if given_out:
        out_g = torch.full((n + extra_rows, 1, 512), 1.0, dtype=torch.float8_e4m3fn)
        out_w = out_g.clone()
    else:
        out_g = out_w = None
    got = sgl.gather_dequant_requant_fp8_paged_dsv4(cache, ids, page_size, extra_rows=extra_rows, out=out_g)
    want = R.gather_dequant_requant_fp8_paged_dsv4(cache, ids, page_size, extra_rows=extra_rows, out=out_w)
    assert got.shape == (n + extra_rows, 1, 512) and got.dtype == torch.float8_e4m3fn
    assert np.array_equal(_bytes(got), _bytes(want))
    assert not _bytes(got)[n:].any()


# --- vLLM ---------------------------------------------------------------------------------------

@needs_vllm
@pytest.mark.parametrize("block_size,seq_lens,gather_lens,offset", [
    (64, [70, 1, 130], [70, 1, 5], 0),
    (64, [64, 0, 100], [10, 0, 33], 7),
    (16, [40, 17], None, 0),          # compressed-cache call: gather_lens None, whole sequence
    (2, [5, 3, 4], None, 2),
])
def test_vllm_triton_fallback(vllm_kernel, block_size, seq_lens, gather_lens, offset):
    num_blocks = 12
    cache = R.build_cache("v4", num_blocks, block_size, seed=block_size + offset, scale_range=(16, 240))
    k_cache = R.vllm_view(cache, block_size)
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    gl = None if gather_lens is None else torch.tensor(gather_lens, dtype=torch.int32)
    bt = R.random_requests(num_blocks, block_size, seq_lens, seed=offset)
    m = offset + max(gather_lens or seq_lens) + 3
    out_got = torch.full((len(seq_lens), m, 512), -2.0, dtype=torch.bfloat16)
    out_want = out_got.clone()
    _vllm_launch(vllm_kernel, out_got, k_cache, sl, gl, bt, block_size, offset)
    R.dequantize_and_gather_k_cache(out_want, k_cache, sl, gl, bt, block_size, offset)
    assert np.array_equal(_bytes(out_got), _bytes(out_want))


@needs_vllm
def test_vllm_triton_fallback_over_padded_block_stride(vllm_kernel):
    """A block stride beyond the 576-aligned minimum (vLLM may pad pages further)."""
    block_size = 64
    cache = R.build_cache("v4", 5, block_size, seed=9, scale_range=(16, 240), page_bytes=37440 + 576 * 3)
    k_cache = R.vllm_view(cache, block_size)
    sl = torch.tensor([150, 90], dtype=torch.int32)
    gl = torch.tensor([150, 64], dtype=torch.int32)
    bt = R.random_requests(5, block_size, [150, 90], seed=9)
    out_got = torch.zeros((2, 160, 512), dtype=torch.bfloat16)
    out_want = out_got.clone()
    _vllm_launch(vllm_kernel, out_got, k_cache, sl, gl, bt, block_size, 4)
    R.dequantize_and_gather_k_cache(out_want, k_cache, sl, gl, bt, block_size, 4)
    assert np.array_equal(_bytes(out_got), _bytes(out_want))
