"""indexer_k_scatter without a GPU: the torch (CPU) path against the independent per-token
reference (tests/helpers/scatter_cases.py), the kernel choice, torch.library registration, and
every bad argument (named, nothing written)."""
import random
import re

import pytest
import torch

import nvrtc_gather as ng
from nvrtc_gather.ops import indexer_k_scatter as op
from helpers.scatter_cases import FP8, make_scatter_case, scatter_reference


@pytest.mark.parametrize("seed", range(40))
def test_cpu_path_matches_the_reference(seed):
    c = make_scatter_case(random.Random(seed))
    want = scatter_reference(c)
    ng.indexer_k_scatter(*c.args())
    assert torch.equal(c.store, want), c.desc


def test_sglang_shapes_fp8_k_and_one_scale_per_token():
    """SGLang's SetKAndS: index_k fp8 [T, 128], index_k_scale fp32 [T] or [T, 1], 64-token pages."""
    for kind in ("f32_1d", "f32"):
        c = make_scatter_case(random.Random(7), head_dim=128, nq=1, block_size=64, num_blocks=5, num_tokens=100,
                              scale_kind=kind)
        want = scatter_reference(c)
        ng.indexer_k_scatter(*c.args())
        assert torch.equal(c.store, want)


def test_every_slot_edge_and_padding():
    c = make_scatter_case(random.Random(1), head_dim=128, nq=1, block_size=64, num_blocks=3, num_tokens=5)
    c.slot_mapping.copy_(torch.tensor([0, 191, -1, 64, -2**63]))
    want = scatter_reference(c)
    ng.indexer_k_scatter(*c.args())
    assert torch.equal(c.store, want)


@pytest.mark.parametrize("bad", [192, 2**31, 2**63 - 1])
def test_a_slot_past_the_cache_raises_before_writing(bad):
    c = make_scatter_case(random.Random(2), head_dim=128, nq=1, block_size=64, num_blocks=3, num_tokens=4)
    c.slot_mapping.copy_(torch.tensor([0, 5, bad, 7]))
    before = c.store.clone()
    with pytest.raises(ValueError, match=f"slot_mapping: entry 2 = {bad} is past the cache's last slot"):
        ng.indexer_k_scatter(*c.args())
    assert torch.equal(c.store, before)


def test_vector_width_follows_alignment():
    for k_off, kv_off, vec in ((0, 0, 16), (8, 0, 8), (0, 4, 4), (4, 8, 4)):
        c = make_scatter_case(random.Random(3), head_dim=128, nq=1, block_size=16, num_blocks=2, num_tokens=3,
                              k_offset=k_off, kv_offset=kv_off)
        c = make_scatter_case(random.Random(3), head_dim=128, nq=1, block_size=16, num_blocks=2, num_tokens=3,
                              k_offset=k_off, kv_offset=kv_off) if c.k.stride(0) % 16 or c.block_stride % 16 else c
        plan = op.plan_scatter(*c.args())
        want = op.spec.vector_width(plan.k_ptr | plan.kv_ptr | op._low_bits(plan))
        assert op.launch_config(plan).entry == f"indexer_k_scatter_v{want}"
        assert want <= vec


@pytest.mark.parametrize("block_size, head_dim, nq, slots, fixed", [
    (64, 128, 1, torch.int64, True), (64, 128, 1, torch.int32, True),  # SGLang's default layout
    (32, 128, 1, torch.int64, False), (64, 64, 1, torch.int64, False), (64, 128, 2, torch.int32, False)])
def test_the_fixed_layout_takes_its_constant_size_entries(block_size, head_dim, nq, slots, fixed):
    """Calls of spec.FIXED_LAYOUT (block size, head_dim, scale words) launch the entries built
    with those sizes as constants (FIXED_TAG); a layout differing in any of the three the general ones."""
    c = make_scatter_case(random.Random(4), head_dim=head_dim, nq=nq, block_size=block_size, num_blocks=2,
                          num_tokens=3, slot_dtype=slots)
    entry = op.launch_config(op.plan_scatter(*c.args())).entry
    vec = int(re.fullmatch(r"indexer_k_scatter_v(\d+)(_p64k128)?(_i32)?", entry).group(1))
    assert entry == op.spec.entry_name(vec, "i64" if slots == torch.int64 else "i32", fixed)
    assert (op.spec.FIXED_TAG in entry) == fixed


def _args(**over):
    args = dict(k=torch.zeros(4, 128, dtype=FP8), k_scale=torch.ones(4), kv_cache=torch.zeros(3, 64, 132, dtype=torch.uint8),
                slot_mapping=torch.tensor([0, 1, 2, 3]))
    args.update(over)
    return args


@pytest.mark.parametrize("over, error, match", [
    (dict(k=[[0] * 128] * 4), TypeError, "k: expected a torch.Tensor, got list"),
    (dict(k=torch.zeros(4, 128, dtype=torch.bfloat16)), TypeError, "k: expected dtype torch.float8_e4m3fn or torch.uint8"),
    (dict(k_scale=torch.ones(4, dtype=torch.float64)), TypeError, "k_scale: expected dtype torch.float32 or torch.uint8"),
    (dict(slot_mapping=torch.tensor([0, 1, 2, 3], dtype=torch.int16)), TypeError,
     "slot_mapping: expected dtype torch.int64 or torch.int32"),
    (dict(kv_cache=torch.zeros(3, 64, 132, dtype=torch.float32)), TypeError, "kv_cache: expected dtype torch.uint8"),
    (dict(k=torch.zeros(4, 126, dtype=FP8)), ValueError, "k: head_dim \\(dim 1\\) must be a positive multiple of 4"),
    (dict(k_scale=torch.ones(4, 3)), ValueError, "k_scale: 3 scales per token do not divide head_dim=128"),
    (dict(k_scale=torch.ones(4, 6, dtype=torch.uint8)), ValueError, "k_scale: a uint8 k_scale holds 4 bytes per fp32 scale"),
    (dict(k_scale=torch.ones(4, 1, 1)), ValueError, "k_scale: expected 2 dimensions"),
    (dict(k_scale=torch.ones(3)), ValueError, "slot_mapping: 4 entries, more than the 3 rows of k_scale"),
    (dict(k=torch.zeros(3, 128, dtype=FP8)), ValueError, "slot_mapping: 4 entries, more than the 3 rows of k"),
    (dict(kv_cache=torch.zeros(3, 64, 130, dtype=torch.uint8)), ValueError, "kv_cache: cache_stride \\(dim 2\\) must be at least"),
    (dict(kv_cache=torch.zeros(3, 64 * 132, dtype=torch.uint8)), ValueError, "kv_cache: expected 3 dimensions"),
    (dict(k=torch.zeros(4, 256, dtype=FP8)[:, ::2]), ValueError, "k: the last dimension must be contiguous"),
    (dict(k_scale=torch.ones(4, 2)[:, :1].t().contiguous().t()[:, :1]), None, None),
    (dict(k=torch.zeros(4 * 128 + 1, dtype=torch.uint8)[1:].view(4, 128)), ValueError, "k: data pointer"),
    (dict(k_scale=torch.zeros(17, dtype=torch.uint8)[1:].view(4, 4)), ValueError, "k_scale: data pointer"),
    (dict(slot_mapping=torch.tensor([[0, 1, 2, 3]])), ValueError, "slot_mapping: expected 1 dimensions"),
])
def test_bad_arguments_are_named_and_nothing_is_written(over, error, match):
    args = _args(**over)
    before = args["kv_cache"].clone()
    if error is None:  # the control: a legal variation runs
        ng.indexer_k_scatter(**args)
        return
    with pytest.raises(error, match=match):
        ng.indexer_k_scatter(**args)
    assert torch.equal(args["kv_cache"], before)


def test_inputs_inside_the_cache_are_refused():
    kv = torch.zeros(3, 64, 132, dtype=torch.uint8)
    k = kv.view(-1)[:512].view(4, 128).view(FP8)
    with pytest.raises(ValueError, match="kv_cache: its memory overlaps k"):
        ng.indexer_k_scatter(k, torch.ones(4), kv, torch.tensor([0, 1, 2, 3]))
    scale = kv.view(-1)[1024:1040].view(torch.float32)
    with pytest.raises(ValueError, match="kv_cache: its memory overlaps k_scale"):
        ng.indexer_k_scatter(torch.zeros(4, 128, dtype=FP8), scale, kv, torch.tensor([0, 1, 2, 3]))


def test_registered_op_opcheck_and_compile():
    c = make_scatter_case(random.Random(11), head_dim=128, nq=1, block_size=16, num_blocks=4, num_tokens=20,
                          scale_kind="f32")
    want = scatter_reference(c)
    k, s, kv, slots = c.args()  # as bytes: opcheck's schema check does arithmetic torch lacks for fp8
    torch.library.opcheck(torch.ops.nvrtc_gather.indexer_k_scatter.default,
                          (k.view(torch.uint8), s, kv.view(torch.uint8), slots))
    torch._dynamo.reset()

    def write(k, s, kv, slots):
        ng.indexer_k_scatter(k, s, kv, slots)
        return kv.view(torch.uint8).to(torch.int64).sum()

    c2 = make_scatter_case(random.Random(11), head_dim=128, nq=1, block_size=16, num_blocks=4, num_tokens=20,
                           scale_kind="f32")
    torch.compile(write, fullgraph=True, backend="aot_eager")(*c2.args())
    assert torch.equal(c2.store, want)


def test_overlap_is_refused_under_aot_eager():
    kv = torch.zeros(3, 64, 132, dtype=torch.uint8)
    scale = kv.view(-1)[1024:1040].view(torch.float32)
    torch._dynamo.reset()

    def write(k, s, kv, slots):
        ng.indexer_k_scatter(k, s, kv, slots)
        return kv.sum()

    before = kv.clone()
    with pytest.raises(Exception, match="kv_cache: its memory overlaps k_scale"):
        torch.compile(write, fullgraph=True, backend="aot_eager")(torch.zeros(4, 128, dtype=FP8), scale, kv,
                                                                  torch.tensor([0, 1, 2, 3]))
    assert torch.equal(kv, before)
