"""vLLM's own test cases for cp_gather_cache and gather_and_maybe_dequant_cache, run against our
kernels (issue 27). Rewritten from vLLM's tests/kernels/attention/test_cache.py (the version at
vllm-project/vllm@00228592: test_gather_and_maybe_dequant_cache_mla, test_cp_gather_cache_mla)
and tests/kernels/test_cache_kernels.py (test_gather_cache_oob, the version with token_to_seq and
576-value entries that vLLM 0.33's kernel requires): the same parameters, caches, block tables and
per-request reference (each request's blocks concatenated, the last one cut; fp8 codes times the
scale), compared bit for bit where vLLM's tests use assert_close. Additions beyond vLLM's
parameters are marked as such."""
import pytest
import torch

import nvrtc_gather as ng

pytestmark = pytest.mark.gpu

# vLLM's parameters (test_cache.py): kv_lora_rank 512 + qk_rope_head_dim 64, block 16, 1024
# blocks, 8 requests, max_seq_len 512, float32 workspace, scale 0.1.
KV_LORA_RANK, QK_ROPE_HEAD_DIM = 512, 64
ENTRY = KV_LORA_RANK + QK_ROPE_HEAD_DIM
BLOCK_SIZE, NUM_BLOCKS, MAX_SEQ_LEN, BATCH = 16, 1024, 512, 8
SENTINEL = 0xA5


def _mla_cache(dtype: torch.dtype, kv_cache_dtype: str) -> torch.Tensor:
    """vLLM's _create_mla_cache + _fill_mla_cache: randn entries; for "fp8", the e4m3 codes of
    fp16 randn values (vLLM's convert_fp8 with scale 1.0), stored as uint8."""
    shape = (NUM_BLOCKS, BLOCK_SIZE, ENTRY)
    if kv_cache_dtype == "fp8":
        vals = torch.randn(*shape, device="cuda", dtype=torch.float16)
        return vals.to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.randn(*shape, device="cuda", dtype=dtype)


def _requests(lens: torch.Tensor):
    """cu_seq_lens (int32, [batch + 1]) and a block table whose every row is a random
    permutation of all blocks (vLLM's)."""
    cu = torch.zeros(BATCH + 1, dtype=torch.int32, device="cuda")
    cu[1:] = lens.cumsum(0).to(torch.int32)
    block_table = torch.empty(BATCH, NUM_BLOCKS, dtype=torch.int32, device="cuda")
    for b in range(BATCH):
        block_table[b] = torch.randperm(NUM_BLOCKS, device="cuda")
    return cu, block_table


def _expected(src_cache, block_table, lens, convert) -> torch.Tensor:
    """vLLM's reference: per request, its first ceil(len / block_size) blocks concatenated, the
    last one cut to the remaining tokens; ``convert`` maps gathered entries to dst values."""
    rows = []
    for b in range(BATCH):
        s = int(lens[b])
        if s == 0:
            continue
        tot = (s + BLOCK_SIZE - 1) // BLOCK_SIZE
        blocks = block_table[b, :tot].tolist()
        for i in range(tot - 1):
            rows.append(convert(src_cache[blocks[i]]))
        rows.append(convert(src_cache[blocks[-1], :s - (tot - 1) * BLOCK_SIZE]))
    return torch.cat(rows, dim=0)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


# vLLM's dtype is float32; bfloat16 (the usual MLA workspace) is our addition.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@torch.inference_mode()
def test_gather_and_maybe_dequant_cache_mla(kv_cache_dtype, dtype):
    torch.manual_seed(0)
    scale = torch.tensor(0.1, dtype=torch.float32, device="cuda")
    src_cache = _mla_cache(dtype, kv_cache_dtype)
    lens = torch.randint(MAX_SEQ_LEN, MAX_SEQ_LEN + 1, (BATCH,), device="cuda")  # every request 512 tokens
    total = int(lens.sum())
    cu, block_table = _requests(lens)
    token_to_seq = torch.repeat_interleave(torch.arange(BATCH, dtype=torch.int32, device="cuda"), lens)
    dst = torch.zeros(total, ENTRY, dtype=dtype, device="cuda")

    def convert(entries):
        if kv_cache_dtype == "fp8":  # float(code) * scale in fp32 (one multiply), then dst's dtype
            return (entries.view(torch.float8_e4m3fn).to(torch.float32) * scale).to(dtype)
        return entries
    expected = _expected(src_cache, block_table, lens, convert)
    ng.gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu, token_to_seq, total, kv_cache_dtype, scale,
                                      None)
    torch.cuda.synchronize()
    assert torch.equal(_bits(dst), _bits(expected))


# vLLM runs "auto" (float32 entries); "fp8" (uint8 entries, which vLLM's comment suggests) is ours.
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@torch.inference_mode()
def test_cp_gather_cache_mla(kv_cache_dtype):
    torch.manual_seed(0)
    src_cache = _mla_cache(torch.float32, kv_cache_dtype)
    lens = torch.randint(0, MAX_SEQ_LEN + 1, (BATCH,), device="cuda")  # empty requests possible
    total = int(lens.sum())
    cu, block_table = _requests(lens)
    dst = torch.zeros(total, ENTRY, dtype=src_cache.dtype, device="cuda")
    expected = _expected(src_cache, block_table, lens, lambda entries: entries)
    ng.cp_gather_cache(src_cache, dst, block_table, cu, BATCH)
    torch.cuda.synchronize()
    assert torch.equal(_bits(dst), _bits(expected))


@torch.inference_mode()
def test_gather_cache_oob():
    """vLLM issues #27909 / #45380: seq_starts pushes the request's pages past its block_table
    row (position 128 of a 2-block row of 64-token blocks). vLLM's kernel skips those pages and
    its test only asks for no out-of-bounds access (run it under compute-sanitizer); our
    contract is the same skip, so every row stays as it was (poisoned here)."""
    block_size, seq_len, num_blocks = 64, 65, 5
    block_table = torch.tensor([[1, 2]], dtype=torch.int32, device="cuda")
    seq_starts = torch.tensor([128], dtype=torch.int32, device="cuda")
    cu_seq_lens = torch.tensor([0, seq_len], dtype=torch.int32, device="cuda")
    token_to_seq = torch.zeros(seq_len, dtype=torch.int32, device="cuda")
    src_cache = torch.randn(num_blocks, block_size, ENTRY, dtype=torch.float16, device="cuda")
    dst = torch.empty(seq_len, ENTRY, dtype=torch.float16, device="cuda")
    dst.view(torch.uint8).fill_(SENTINEL)
    scale = torch.tensor([1.0], dtype=torch.float32, device="cuda")
    ng.gather_and_maybe_dequant_cache(src_cache, dst, block_table, cu_seq_lens, token_to_seq, seq_len, "auto", scale,
                                      seq_starts)
    torch.cuda.synchronize()
    assert bool((dst.view(torch.uint8) == SENTINEL).all())
    # the same through the byte copy (its fp8 form): nothing written either
    dst8 = torch.full((seq_len, ENTRY), SENTINEL, dtype=torch.uint8, device="cuda")
    ng.cp_gather_cache(src_cache.view(torch.uint8)[..., :ENTRY].contiguous(), dst8, block_table, cu_seq_lens, 1,
                       seq_starts)
    torch.cuda.synchronize()
    assert bool((dst8 == SENTINEL).all())
