"""One list per op of what it writes and what it reads (WRITES, READS): the full checks, the
fast path and the fake implementation take their names from it, so a tensor the op reads
cannot be checked eagerly and forgotten at trace time (issue #26 item 2: the MLA write's fake
left out ``scale``, so ``aot_eager`` wrote 1,152 bytes through a scale inside kv_cache)."""
import re

import pytest
import torch

import nvrtc_gather as ng
from nvrtc_gather.ops import cache_gather, gather, indexer_k_quant, indexer_k_scatter, library, mla_gather, mla_write
from helpers.fresh_python import run

OPS = {"cp_gather_indexer_k_quant_cache": gather, "indexer_k_quant_and_cache": indexer_k_quant,
       "concat_and_cache_mla": mla_write, "cp_gather_and_upconvert_fp8_kv_cache": mla_gather,
       "cp_gather_cache": cache_gather, "gather_and_maybe_dequant_cache": cache_gather,
       "indexer_k_scatter": indexer_k_scatter}


@pytest.mark.parametrize("name", OPS)
def test_the_list_names_every_tensor_argument_of_the_schema(name):
    """Written: the schema's Tensor(a!) arguments; read: every other tensor argument."""
    schema = getattr(torch.ops.nvrtc_gather, name).default._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    tensors = [a.name for a in schema.arguments if re.match(r"Tensor", str(a.type)) or "Tensor" in str(a.type)]
    module = OPS[name]
    unread = getattr(module, "UNREAD", ())  # accepted and checked, never read (documented)
    read = {t for t in tensors if t not in written and t not in unread}
    assert list(module.WRITES) == written
    assert read <= set(module.READS) and set(module.READS) - read <= set(_SHARED_ONLY.get(name, ())), \
        (name, module.READS, read)


_SHARED_ONLY = {"cp_gather_cache": ("scale",)}  # a READS entry of the module's other op only


def _mla_case():
    kv_c = torch.randn(4, 512, dtype=torch.bfloat16)
    k_pe = torch.randn(4, 64, dtype=torch.bfloat16)
    kv_cache = torch.randint(0, 256, (2, 16, 576), dtype=torch.uint8)
    slots = torch.tensor([0, 5, 17, 30])
    return kv_c, k_pe, kv_cache, slots


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("fmt", ["fp8", "fp8_e4m3"])
def test_mla_fp8_scale_inside_the_cache_is_refused_and_nothing_is_written(backend, fmt):
    torch._dynamo.reset()
    kv_c, k_pe, kv_cache, slots = _mla_case()
    before = kv_cache.clone()

    def step(kv_c, k_pe, kv_cache, slots):
        scale = kv_cache.view(-1)[1000:1004].view(torch.float32)  # a float32 view inside the cache
        ng.concat_and_cache_mla(kv_c, k_pe, kv_cache, slots, fmt, scale)
        return kv_cache.sum()

    fn = step if backend == "eager" else torch.compile(step, fullgraph=True, backend=backend)
    with pytest.raises(Exception) as info:  # dynamo wraps the fake's ValueError
        fn(kv_c, k_pe, kv_cache, slots)
    assert "kv_cache: its memory overlaps scale" in str(info.value), str(info.value)[:2000]
    assert torch.equal(kv_cache, before)


def test_mla_scale_inside_the_cache_is_allowed_where_it_is_not_read():
    """skip_scale (and the formats that ignore scale) read no scale: no overlap to refuse."""
    torch._dynamo.reset()
    kv_c, k_pe, kv_cache, slots = _mla_case()

    def step(kv_c, k_pe, kv_cache, slots):
        scale = kv_cache.view(-1)[1000:1004].view(torch.float32)
        ng.concat_and_cache_mla(kv_c, k_pe, kv_cache, slots, "fp8", scale, True)
        return kv_cache.sum()

    want = kv_cache.clone()
    ng.concat_and_cache_mla(kv_c, k_pe, want, slots, "fp8", torch.ones(1), True)
    torch.compile(step, fullgraph=True, backend="aot_eager")(kv_c, k_pe, kv_cache, slots)
    assert torch.equal(kv_cache, want)


def test_mla_scale_inside_the_cache_is_refused_through_the_vllm_adapter():
    got = run("""
        import json, torch
        from nvrtc_gather.integrations import vllm
        vllm.register()
        kv_c = torch.randn(4, 512, dtype=torch.bfloat16); k_pe = torch.randn(4, 64, dtype=torch.bfloat16)
        kv_cache = torch.randint(0, 256, (2, 16, 576), dtype=torch.uint8); slots = torch.tensor([0, 5, 17, 30])
        before = kv_cache.clone()
        def step(kv_c, k_pe, kv_cache, slots):
            scale = kv_cache.view(-1)[1000:1004].view(torch.float32)
            torch.ops._C_cache_ops.concat_and_cache_mla(kv_c, k_pe, kv_cache, slots, "fp8", scale)
            return kv_cache.sum()
        try:
            torch.compile(step, fullgraph=True, backend="aot_eager")(kv_c, k_pe, kv_cache, slots)
            msg = ""
        except Exception as exc:
            msg = str(exc)
        print(json.dumps({"refused": "kv_cache: its memory overlaps scale" in msg,
                          "untouched": bool(torch.equal(kv_cache, before))}))
    """)
    assert got == {"refused": True, "untouched": True}


@pytest.mark.parametrize("name", ["block_table", "workspace_starts", "seq_starts", "src_cache"])
def test_mla_gather_fake_refuses_each_read_tensor_inside_dst(name):
    """The fake sees each READS entry: a read tensor carved from dst is refused at trace time."""
    torch._dynamo.reset()
    src = torch.randint(0, 256, (2, 16, 656), dtype=torch.uint8)
    bt = torch.tensor([[0, 1]], dtype=torch.int32)
    ws = torch.tensor([0], dtype=torch.int32)
    seq = torch.tensor([0], dtype=torch.int32)

    def step(src, dst):
        args = dict(src_cache=src, block_table=bt, workspace_starts=ws, seq_starts=seq)
        inside = dst.view(torch.uint8).view(-1)
        if name == "src_cache":
            args[name] = inside[: 2 * 16 * 656].view(2, 16, 656)
        else:
            args[name] = inside[:8].view(torch.int32)[: args[name].numel()].view(args[name].shape)
        ng.cp_gather_and_upconvert_fp8_kv_cache(args["src_cache"], dst, args["block_table"],
                                                args["workspace_starts"], 1, args["seq_starts"])
        return dst.sum()

    dst = torch.zeros(20, 576, dtype=torch.bfloat16)
    with pytest.raises(Exception) as info:
        torch.compile(step, fullgraph=True, backend="aot_eager")(src, dst)
    assert f"dst: its memory overlaps {name}" in str(info.value), str(info.value)[:2000]


def _gather_case():
    kv = torch.randint(0, 256, (4, 16, 132), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    bt = torch.tensor([[2, 0]], dtype=torch.int32)
    cu = torch.tensor([0, 20], dtype=torch.int32)
    return kv, bt, cu


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_gather_outputs_sharing_bytes_are_refused(backend):
    """dst_k and dst_scale overlapping each other: which write lands would be unspecified."""
    torch._dynamo.reset()
    kv, bt, cu = _gather_case()
    buf = torch.full((20 * 128,), 0xA5, dtype=torch.uint8)

    def step(kv, bt, cu, buf):
        dst_k = buf.view(20, 128)
        dst_s = buf[64: 64 + 20 * 4].view(20, 4)  # inside dst_k's rows 0-1
        ng.cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu)
        return buf.sum()

    fn = step if backend == "eager" else torch.compile(step, fullgraph=True, backend=backend)
    with pytest.raises(Exception) as info:
        fn(kv, bt, cu, buf)
    assert "dst_k: its memory overlaps dst_scale" in str(info.value), str(info.value)[:2000]
    assert bool((buf == 0xA5).all())


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_gather_outputs_side_by_side_in_one_buffer_are_accepted(backend):
    """buf[:, :128] and buf[:, 128:] share no byte though their address spans overlap."""
    torch._dynamo.reset()
    kv, bt, cu = _gather_case()
    buf = torch.full((20, 132), 0xA5, dtype=torch.uint8)

    def step(kv, bt, cu, buf):
        ng.cp_gather_indexer_k_quant_cache(kv, buf[:, :128], buf[:, 128:], bt, cu)
        return buf.sum()

    want_k, want_s = torch.empty(20, 128, dtype=torch.uint8), torch.empty(20, 4, dtype=torch.uint8)
    ng.cp_gather_indexer_k_quant_cache(kv, want_k, want_s, bt, cu)
    fn = step if backend == "eager" else torch.compile(step, fullgraph=True, backend=backend)
    fn(kv, bt, cu, buf)
    assert torch.equal(buf[:, :128], want_k) and torch.equal(buf[:, 128:], want_s)


def test_rows_disjoint_against_a_byte_map():
    """checks.rows_disjoint against marking every byte, over small layouts."""
    from nvrtc_gather.ops.checks import rows_disjoint
    for stride in range(1, 9):
        for aw in range(1, 5):
            for bw in range(1, 5):
                for b in range(0, 24):
                    for rows in (1, 2, 3):
                        used = [0] * 64
                        for i in range(rows):
                            for c in range(aw):
                                used[i * stride + c] |= 1
                            for c in range(bw):
                                used[b + i * stride + c] |= 2
                        want = 3 not in used
                        assert rows_disjoint(0, aw, b, bw, stride, rows) == want, (stride, aw, bw, b, rows)
