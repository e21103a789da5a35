"""The kernel specs against the CUDA sources: each parameter struct is declared once in a
``.cuh`` and mirrored in its family's spec (nvrtc_gather/kernels/); this test keeps the two
the same, field by field (name, kind, order), packs by name as the struct lays out, and keeps
the debug error codes of common.cuh and jit/debug_errors.py one table."""
import re
import struct

import pytest

from nvrtc_gather import kernels
from nvrtc_gather.jit import compiler, debug_errors, sources, spec
from nvrtc_gather.kernels import cache_gather, dsv4_gather, gather as gather_kernels, index_k_read, indexer_k_quant as quant_kernels
from nvrtc_gather.kernels import mla_cache
from nvrtc_gather.kernels import indexer_k_scatter as scatter_kernels

_KIND = {"i64": "i64", "i32": "i32"}
# every parameter struct and the header declaring it
FAMILIES = [(gather_kernels.PARAMS, "gather_params.cuh"), (quant_kernels.PARAMS, "quant_params.cuh"),
            (index_k_read.PARAMS, "index_k_read_params.cuh"), (dsv4_gather.PARAMS, "dsv4_params.cuh"),
            (mla_cache.WRITE_PARAMS, "mla_params.cuh"), (mla_cache.GATHER_PARAMS, "mla_params.cuh"),
            (cache_gather.PARAMS, "cache_gather_params.cuh"), (scatter_kernels.PARAMS, "scatter_params.cuh")]
FAMILY_IDS = ["gather", "quant", "index_k_read", "dsv4", "mla_write", "mla_gather", "cache_gather", "scatter"]
KERNEL_SOURCES = ("gather_indexer_k.cu", "index_k_read.cu", "dsv4_gather.cu", "quant_cache.cu", "mla_write.cu", "mla_gather.cu", "cache_gather.cu",
                  "indexer_k_scatter.cu")


def cuh_fields(header: str, struct_name: str) -> list[tuple[str, str]]:
    """(name, "ptr" | "i64" | "i32") of each field of ``struct_name`` in cuda_src/``header``."""
    text = sources.read_source(header)
    body = re.search(r"struct\s+" + struct_name + r"\s*\{(.*?)\};", text, re.S).group(1)
    out = []
    for line in body.splitlines():
        line = line.split("//", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"(?:const\s+)?(\w+)\s*(\*?)\s*(\w+)\s*;", line)
        assert m, f"cannot read the field {line!r} of {struct_name}"
        ctype, star, name = m.groups()
        out.append((name, "ptr" if star else _KIND[ctype]))
    return out


@pytest.mark.parametrize("params,header", FAMILIES, ids=FAMILY_IDS)
def test_param_structs_match_their_headers(params, header):
    assert list(params.fields) == cuh_fields(header, params.name)


def test_every_registered_struct_is_listed_here():
    assert {m.params.name for m in kernels.ALL_MODULES} == {p.name for p, _ in FAMILIES}


@pytest.mark.parametrize("params,header", FAMILIES, ids=FAMILY_IDS)
def test_param_structs_have_no_padding(params, header):
    """The host packs the fields back to back ("<" layout); the compiler aligns each field to
    its size and the struct to 8 bytes. The two agree only when no field needs padding: each
    one at a multiple of its size, the whole a multiple of 8 (MlaWriteParams with five i32
    fields once put ``error`` at byte 100 for the host, 104 for the kernel)."""
    offset = 0
    for name, kind in params.fields:
        size = 4 if kind == "i32" else 8
        assert offset % size == 0, f"{params.name}.{name} at byte {offset}: the compiler would pad before it"
        offset += size
    assert offset == params.layout.size and offset % 8 == 0, f"{params.name}: {offset} bytes, not a multiple of 8"


@pytest.mark.parametrize("params", [p for p, _ in FAMILIES], ids=FAMILY_IDS)
def test_packing_by_name_is_the_struct_layout(params):
    values = {name: 1000 + i for i, name in enumerate(params.names)}
    want = params.layout.pack(*values.values())
    assert params.pack(**values) == want
    # The launchers' way: the image with every field but the data pointers and the error buffer,
    # then the pointers (and in debug mode the error buffer) written into a copy of it.
    pointers = params.pointer_names
    assert pointers and all(kind == "ptr" for _, kind in params.fields[:len(pointers)])
    image = params.image(**{n: v for n, v in values.items() if n not in pointers + ("error",)})
    assert image.pointers == pointers and len(image.template) == params.layout.size
    buf = bytearray(image.template)
    image.pack_pointers(buf, 0, *(values[n] for n in pointers))
    assert bytes(buf) == params.pack(**dict(values, error=0))
    image.pack_error(buf, image.error_offset, values["error"])
    assert bytes(buf) == want
    with pytest.raises(TypeError, match="missing"):
        params.pack(**{n: v for n, v in values.items() if n != "error"})
    with pytest.raises(TypeError, match="unknown"):
        params.image(no_such_field=1)
    with pytest.raises(TypeError, match="leading pointers"):  # the last pointer free, the first fixed
        params.image(**{n: v for n, v in values.items() if n not in (pointers[-1], "error")})
    with pytest.raises(TypeError, match="leading pointers"):  # a size left free
        params.image(**{n: v for n, v in values.items() if n not in (params.names[len(pointers)], "error")})


def test_the_ops_fill_every_struct_field_by_name():
    from nvrtc_gather.ops import cache_gather as cache_gather_op, gather, indexer_k_quant, indexer_k_scatter, \
        mla_gather, mla_write
    for params, fields_of, plan_type in (
            (cache_gather.PARAMS, cache_gather_op.struct_fields, cache_gather_op.CacheGatherPlan),
            (gather_kernels.PARAMS, gather.struct_fields, gather.GatherPlan),
            (quant_kernels.PARAMS, indexer_k_quant.struct_fields, indexer_k_quant.QuantPlan),
            (mla_cache.WRITE_PARAMS, mla_write.struct_fields, mla_write.WritePlan),
            (mla_cache.GATHER_PARAMS, mla_gather.struct_fields, mla_gather.MlaGatherPlan),
            (scatter_kernels.PARAMS, indexer_k_scatter.struct_fields, indexer_k_scatter.ScatterPlan)):
        plan = plan_type(**{f: 1 for f in plan_type._fields})
        assert set(fields_of(plan)) == set(params.names) - {"error"}


def test_module_names_are_distinct_and_entries_unique():
    names = [m.name for m in kernels.ALL_MODULES]
    assert len(set(names)) == len(names) and tuple(kernels.ALL_MODULES) == spec.registered()
    entries = [e for m in kernels.ALL_MODULES for e in m.kernels]
    assert len(set(entries)) == len(entries)


def test_each_family_has_every_entry_in_the_module_it_loads_for_it():
    for vec in gather_kernels.VECTOR_WIDTHS:
        assert set(gather_kernels.MODULES[vec].kernels) == {gather_kernels.entry_name(vec, s)
                                                           for s in gather_kernels.SHAPES}
    for (k_type, vec, shape), m in quant_kernels.MODULES.items():
        assert m.kernels == (quant_kernels.entry_name(k_type, vec, shape),)
    assert {key[1:] for key in quant_kernels.MODULES} == {(v, s) for v in quant_kernels.VECTOR_WIDTHS
                                                          for s in quant_kernels.shapes(v)}
    for k_type, m in mla_cache.DS_MODULES.items():
        assert set(m.kernels) == {mla_cache.ds_entry(k_type, vec) for vec in mla_cache.VECTOR_WIDTHS}
    for k_type, m in mla_cache.PLAIN_MODULES.items():
        assert set(m.kernels) == {mla_cache.plain_entry(k_type, mode) for mode in mla_cache.PLAIN_MODES}
    assert set(mla_cache.GATHER_MODULE.kernels) == {mla_cache.gather_entry(v) for v in mla_cache.VECTOR_WIDTHS}
    for (conv, widths), m in cache_gather.MODULES.items():
        assert m.kernels == (cache_gather.entry_name(conv, *widths),)
    for conv, m in cache_gather.TINY_MODULES.items():  # small calls of aligned tensors only
        w = cache_gather.widest(conv)
        assert m.kernels == (cache_gather.entry_name(conv, *w, True),) and m.kernels[0].endswith("_tiny")
        assert cache_gather.module_for(conv, w, True) is m
        assert cache_gather.module_for(conv, w, False) is cache_gather.MODULES[conv, w]
        assert cache_gather.module_for(conv, cache_gather.ANY, True) is cache_gather.MODULES[conv, cache_gather.ANY]
    # every (load, store) pair the policy can pick has its module
    for conv in cache_gather.CONVERSIONS:
        for load in cache_gather.VECTOR_WIDTHS:
            for store in cache_gather.VECTOR_WIDTHS:
                assert (conv, cache_gather.pick(conv, load, store)) in cache_gather.MODULES


def test_entry_points_are_generated_from_the_spec_not_chosen_in_the_source():
    for m in kernels.ALL_MODULES:
        text = sources.module_source(m)
        declared = re.findall(r'extern "C" __global__ void __launch_bounds__\(NG_THREADS(?:, \d+)?\) (\w+)\(', text)
        assert declared == list(m.kernels), m.name
        assert f"-DNG_THREADS={m.threads}" in compiler.module_options(m, compiler.Target("sm_90"))
    for name in KERNEL_SOURCES:
        assert 'extern "C" __global__' not in sources.read_source(name) and "NG_QUANT_ENTRY" not in sources.read_source(name) \
            and "NG_GATHER_VEC" not in sources.read_source(name)
    assert "#define NG_THREADS" not in sources.read_source("common.cuh")


def test_an_entrys_block_count_bound_is_its_launch_bounds():
    """Entry.min_blocks is __launch_bounds__' second argument (ptxas keeps the registers to fit that
    many blocks an SM), and only the index-K read's entries that were measured with one have it:
    the request-major entry's, index_k_read.RESIDENT (the 48 registers ptxas chose for it), and its
    constant-size build's, index_k_read.FIXED_RESIDENT (its 64 registers), and the constant-size
    256-row one's, index_k_read.REQ_WIDE_RESIDENT (its 80); the
    wide entry's, index_k_read.WIDE_RESIDENT, one wave of the largest wide grid (the gather's own
    wide entry measured slower bounded)."""
    bounded = set()
    for m in kernels.ALL_MODULES:
        text = sources.module_source(m)
        for e in m.entries:
            bound = f"__launch_bounds__(NG_THREADS, {e.min_blocks}) {e.name}(" if e.min_blocks else \
                f"__launch_bounds__(NG_THREADS) {e.name}("
            assert bound in text, e.name
            if e.min_blocks:
                shape = e.name[len(m.name):].removeprefix(index_k_read.FIXED_TAG).lstrip("_")  # the entry's shape
                bounded.add((shape, e.min_blocks))
    assert bounded == {("req", index_k_read.RESIDENT), ("wide", index_k_read.WIDE_RESIDENT),
                       ("req", index_k_read.FIXED_RESIDENT), ("req_wide", index_k_read.REQ_WIDE_RESIDENT)}
    for m in index_k_read.MODULES.values():  # the request-major constant-size entry: its own bound
        assert {e.min_blocks for e in m.entries if e.name.endswith(index_k_read.FIXED_TAG + "_req")} == \
            {index_k_read.FIXED_RESIDENT}, m.name
    # the wide entry's bound is a wave of the largest wide grid (the rows of one wave of 16 KiB blocks)
    sms, most = 132, gather_kernels.BYTES_PER_CTA // 128
    rows = most * sms * gather_kernels.CTAS_PER_SM
    assert index_k_read.shape_for(128, rows, sms)[1] == "wide" != index_k_read.shape_for(128, rows + 1, sms)[1]
    assert index_k_read.grid(rows, index_k_read.shape_for(128, rows, sms)[0]) == sms * index_k_read.WIDE_RESIDENT


def test_the_write_shapes_tokens_per_lane_come_from_the_spec():
    for (k_type, vec, shape), m in quant_kernels.MODULES.items():
        if vec:
            assert m.entries[0].body.endswith(f", {quant_kernels.SHAPES[shape]}>"), m.name
    assert "NG_QUNROLL" not in sources.read_source("quant_cache.cu")


def test_debug_error_codes_are_one_table():
    header = dict((name, int(code)) for name, code in
                  re.findall(r"#define (NG_ERR_\w+) (\d+)", sources.read_source("common.cuh")))
    assert header == {name: code for name, (code, _) in debug_errors.ERRORS.items()}
    used = set(re.findall(r"NG_ERR_\w+", "".join(sources.read_source(n) for n in KERNEL_SOURCES + ("request_search.cuh",))))
    assert used <= set(header)
    assert {"NG_ERR_SLOT", "NG_ERR_BLOCK_INDEX", "NG_ERR_BLOCK_ID", "NG_ERR_WS_ORDER", "NG_ERR_SEQ_START",
            "NG_ERR_CU_NEGATIVE"} <= used


def test_registering_a_second_module_of_the_same_name_is_refused():
    with pytest.raises(ValueError, match="registered already"):
        spec.register(spec.KernelModule("gather_indexer_k_v16", "x.cu", (), gather_kernels.PARAMS, "x"))


def test_cache_gather_small_calls_take_the_tiny_kernel():
    """The tiny kernel (one warp per row) takes the calls whose tile blocks would be at their
    floor of one row per warp: up to two such blocks per SM, rows of at most 2 KiB."""
    assert cache_gather.use_tiny(576, 2 * 132 * 8, 132) and not cache_gather.use_tiny(576, 2 * 132 * 8 + 1, 132)
    assert cache_gather.use_tiny(2048, 10, 132) and not cache_gather.use_tiny(2052, 10, 132)
    for rows in (1, 1000, 2112):
        assert cache_gather.rows_per_cta(1152, rows, 132) == cache_gather.MIN_ROWS_PER_CTA == cache_gather.WARPS


def test_the_index_k_reads_per_call_shape_rule_is_the_gathers_policy():
    """kernels.index_k_read.shape_rule (bound once per layout, run per call) answers as
    shape_for (the indexer gather's tile policy) for every row count around its thresholds."""
    from nvrtc_gather.kernels import index_k_read
    for head_dim, sms in ((128, 132), (128, 4), (64, 78), (512, 132), (4, 1)):
        rule = index_k_read.shape_rule(head_dim, sms)
        wave = min(256, 16384 // head_dim) * sms * 8
        for n in sorted({1, 7, 8, 9, 100, 1000, 2 * sms * 8, 2 * sms * 8 + 1, wave * 3 // 4, wave * 3 // 4 + 1,
                         wave, wave + 1, 131072, 10**6, 2**31 - 300}):
            assert rule(n) == index_k_read.shape_for(head_dim, n, sms), (head_dim, sms, n)


def test_the_index_k_reads_launch_rule_takes_request_major_tiles_in_place_of_narrow_ones():
    """kernels.index_k_read.launch_rule: request-major tiles (a block per tile of each request,
    grid_by_request) for 2 to 256 requests in place of the narrow row-major tiles, whether their
    grid fits one wave or takes two (the engine's max_seq_len sizes it: within 2x of the
    row-major grid); never for one request or past 256, nor in place of the wide or tiny tiles."""
    from nvrtc_gather.kernels import index_k_read
    sms = 132
    # (requests, rows, max_seq_len) -> shape: the bench's SGLang rows and the A/B runs' multi-wave ones
    cases = {(16, 30155, 3024): "req", (2, 39540, 20791): "req", (200, 60000, 446): "req",
             (8, 144971, 23117): "req", (4, 65536, 24052): "req", (256, 60000, 300): "req",
             (4, 123875, 45465): "wide", (64, 119994, 3000): "wide", (8, 596, 150): "tiny",
             (1, 65536, 65536): "", (257, 60000, 300): "", (1024, 253609, 384): "",
             (8, 144971, 10 * 23117): "",  # the longest request 10x the mean: most of the grid empty
             (8, 144971, 2000): ""}        # max_seq_len far below the rows a request: few blocks, each looping
    for (batch, rows, longest), want in cases.items():
        tpc, shape, blocks = index_k_read.launch_rule(128, sms, batch)(rows, longest)
        assert shape == want, (batch, rows, longest, shape)
        assert tpc == index_k_read.shape_rule(128, sms)(rows)[0]  # the row-major tiles' rows either way
        if shape == "req":
            assert blocks == index_k_read.grid_by_request(batch, longest, tpc)
        else:
            assert blocks == index_k_read.grid(rows, tpc)
    # past one wave of the request-major entry's resident blocks (5 an SM): 1448 blocks
    assert index_k_read.launch_rule(128, sms, 8)(144971, 23117)[2] > sms * index_k_read.RESIDENT


def test_the_fixed_layouts_request_major_grids_past_one_wave_take_256_row_tiles():
    """launch_rule(..., fixed=True) (SGLang's default layout): where the rule takes request-major
    tiles and their grid is past one wave of FIXED_RESIDENT blocks an SM, tiles of THREADS rows
    ("req_wide", its own grid); every other call as the general rule launches it."""
    from nvrtc_gather.kernels import index_k_read
    sms = 132
    cases = {(8, 144971, 23117): "req_wide", (8, 72000, 11500): "req_wide", (3, 253609, 84537): "req_wide",
             (4, 65536, 24052): "req_wide", (16, 30155, 3024): "req", (2, 39540, 20791): "req",
             (4, 123875, 45465): "wide", (8, 596, 150): "tiny", (1, 65536, 65536): "", (1024, 253609, 384): "",
             (8, 144971, 10 * 23117): ""}
    for (batch, rows, longest), want in cases.items():
        general = index_k_read.launch_rule(128, sms, batch)(rows, longest)
        tpc, shape, blocks = index_k_read.launch_rule(128, sms, batch, True)(rows, longest)
        assert shape == want, (batch, rows, longest, shape)
        if want == "req_wide":
            assert general[1] == "req" and general[2] > index_k_read.FIXED_RESIDENT * sms, general
            assert (tpc, blocks) == (index_k_read.THREADS, index_k_read.grid_by_request(batch, longest, tpc))
        else:
            assert (tpc, shape, blocks) == general
    # one wave exactly stays on the 128-row tiles: 4 requests of 132 tiles are 528 blocks
    wave = index_k_read.FIXED_RESIDENT * sms
    assert index_k_read.launch_rule(128, sms, 4, True)(4 * 132 * 128, 132 * 128)[1:] == ("req", wave)
