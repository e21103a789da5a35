"""Hostile battery for the overlap lists (issue #26 item 2, rerun): tensors carved at random
offsets from one byte buffer, so that outputs and inputs overlap in every way; the eager checks
(plan_*: data pointers and exact extents) and the fake implementation (storage offsets, at
trace time) must agree on every layout: refuse the same calls, naming the same pair."""
import random

import pytest
import torch

from nvrtc_gather.ops import gather, indexer_k_quant, indexer_k_scatter, mla_gather, mla_write

N = 1500


def _view(buf, offset, shape, dtype):
    size = torch.empty((), dtype=dtype).element_size()
    count = 1
    for s in shape:
        count *= s
    return buf[offset: offset + count * size].view(dtype).view(shape)


def _verdict(fn, *args):
    try:
        fn(*args)
        return None
    except ValueError as exc:
        msg = str(exc)
        assert "overlaps" in msg, msg  # the layouts below pass every other check
        return msg.split(" (bytes")[0]


def _agree(rng, build, plan, fake, *, min_hits=20):
    hits = 0
    for _ in range(N):
        args = build(rng)
        want, got = _verdict(plan, *args), _verdict(fake, *args)
        assert want == got, (want, got)
        hits += want is not None
    assert min_hits <= hits <= N - min_hits, hits  # both verdicts exercised


def _offset(rng, size, align):
    return rng.randrange(0, size // align) * align


def test_mla_write_eager_and_fake_agree():
    rng = random.Random(1)
    buf = torch.zeros(1 << 13, dtype=torch.uint8)

    def build(rng):
        fmt = rng.choice(["fp8", "fp8_e4m3", "auto"])
        n, rank, pe = rng.randint(1, 4), rng.choice([8, 16]), rng.choice([0, 8])
        dt = rng.choice([torch.float32, torch.bfloat16])
        cache_dt = dt if fmt == "auto" else torch.uint8
        width = rank + pe
        kv = _view(buf, _offset(rng, 6000, 16), (2, 4, width), cache_dt)
        kv_c = _view(buf, _offset(rng, 7000, 4), (n, rank), dt)
        k_pe = _view(buf, _offset(rng, 7000, 4), (n, pe), dt)
        slots = _view(buf, _offset(rng, 7000, 8), (n,), torch.int64)
        scale = _view(buf, _offset(rng, 7000, 4), (1,), torch.float32)
        return kv_c, k_pe, kv, slots, fmt, scale, rng.random() < 0.3

    _agree(rng, build, mla_write.plan_write, mla_write.write_fake)


def test_indexer_quant_eager_and_fake_agree():
    rng = random.Random(2)
    buf = torch.zeros(1 << 13, dtype=torch.uint8)

    def build(rng):
        n, hd = rng.randint(1, 4), rng.choice([16, 32])
        dt = rng.choice([torch.float32, torch.bfloat16])
        kv = _view(buf, _offset(rng, 6000, 4), (2, 4, hd + 4), torch.uint8)
        k = _view(buf, _offset(rng, 7000, 4), (n + rng.randint(0, 2), hd), dt)
        slots = _view(buf, _offset(rng, 7000, 8), (n,), torch.int64)
        return k, kv, slots, hd, "ue8m0"

    _agree(rng, build, indexer_k_quant.plan_quant, indexer_k_quant.quant_fake)


def test_indexer_gather_eager_and_fake_agree():
    rng = random.Random(3)
    buf = torch.zeros(1 << 13, dtype=torch.uint8)

    def build(rng):
        n, batch = rng.randint(1, 6), rng.randint(1, 2)
        kv = _view(buf, _offset(rng, 6000, 4), (2, 4, 36), torch.uint8)
        dst_k = _view(buf, _offset(rng, 7000, 4), (n, 32), torch.uint8)
        dst_s = _view(buf, _offset(rng, 7000, 4), (n, 1), torch.float32)
        bt = _view(buf, _offset(rng, 7000, 4), (batch, 2), torch.int32)
        cu = _view(buf, _offset(rng, 7000, 4), (batch + 1,), torch.int32)
        return kv, dst_k, dst_s, bt, cu

    _agree(rng, build, gather.plan_gather, gather.gather_fake)


def test_mla_gather_eager_and_fake_agree():
    rng = random.Random(4)
    buf = torch.zeros(1 << 15, dtype=torch.uint8)

    def build(rng):
        rows, batch = rng.randint(1, 3), rng.randint(1, 2)
        src = _view(buf, _offset(rng, 20000, 16), (1, 2, 656), torch.uint8)
        dst = _view(buf, _offset(rng, 24000, 16), (rows, 576), torch.bfloat16)
        bt = _view(buf, _offset(rng, 30000, 4), (batch + rng.randint(0, 1), 2), torch.int32)
        ws = _view(buf, _offset(rng, 30000, 4), (batch,), torch.int32)
        seq = _view(buf, _offset(rng, 30000, 4), (batch,), torch.int32) if rng.random() < 0.5 else None
        return src, dst, bt, ws, batch, seq

    _agree(rng, build, mla_gather.plan_gather, mla_gather.gather_fake, min_hits=5)


@pytest.mark.parametrize("op", ["cp_gather_cache", "gather_and_maybe_dequant_cache"])
def test_chunked_gathers_eager_and_fake_agree(op):
    from nvrtc_gather.ops import cache_gather
    rng = random.Random(5)
    buf = torch.zeros(1 << 15, dtype=torch.uint8)
    fake = cache_gather.cp_gather_cache_fake if op == "cp_gather_cache" else \
        cache_gather.gather_and_maybe_dequant_cache_fake

    def build(rng):
        batch, rows = rng.randint(1, 2), rng.randint(1, 3)
        src = _view(buf, _offset(rng, 20000, 16), (2, 2, 64), torch.uint8)
        dst = _view(buf, _offset(rng, 24000, 16), (rows, 64), torch.uint8 if op == "cp_gather_cache" else torch.bfloat16)
        bt = _view(buf, _offset(rng, 30000, 4), (batch + rng.randint(0, 1), 2), torch.int32)
        cu = _view(buf, _offset(rng, 30000, 4), (batch + 1,), torch.int32)
        seq = _view(buf, _offset(rng, 30000, 4), (batch + rng.randint(0, 1),), torch.int32) \
            if rng.random() < 0.5 else None
        if op == "cp_gather_cache":
            return src, dst, bt, cu, batch, seq
        scale = _view(buf, _offset(rng, 30000, 4), (1,), torch.float32)
        t2s = _view(buf, _offset(rng, 30000, 4), (rows,), torch.int32)
        return src, dst, bt, cu, t2s, rows, "fp8", scale, seq

    _agree(rng, build, lambda *a: cache_gather.plan_for(op, *a), fake, min_hits=5)


def test_indexer_scatter_eager_and_fake_agree():
    rng = random.Random(6)
    buf = torch.zeros(1 << 13, dtype=torch.uint8)

    def build(rng):
        n, hd = rng.randint(1, 4), rng.choice([16, 32])
        kv = _view(buf, _offset(rng, 6000, 4), (2, 4, hd + 4), torch.uint8)
        k = _view(buf, _offset(rng, 7000, 4), (n + rng.randint(0, 2), hd), torch.uint8)
        k_scale = _view(buf, _offset(rng, 7000, 4), (n + rng.randint(0, 2), 1), torch.float32)
        slots = _view(buf, _offset(rng, 7000, 8), (n,), torch.int64)
        return k, k_scale, kv, slots

    _agree(rng, build, indexer_k_scatter.plan_scatter, indexer_k_scatter.scatter_fake)
