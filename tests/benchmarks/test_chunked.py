"""benchmarks/chunked.py without a GPU (issue 27): its dry run plans every row (the op's full
checks on each workload, byte counts, the baseline's grid) and compiles the vLLM-style baseline
for sm_90 with NVRTC; and the baseline itself runs on the host emulator, byte-exact against the
independent reference (tests/helpers/cache_gather_reference.py), so that the H200 run does not
find a broken baseline only when it checks it."""
import random

import pytest
import torch

from helpers.cache_gather_reference import make_case, reference
from helpers.host_emu import emu_launch, emulator
from nvrtc_gather.ops import cache_gather


@pytest.fixture(scope="module")
def chunked(bench):
    import chunked
    return chunked


def test_dry_run_plans_every_row_and_compiles_the_baseline(chunked):
    plans = chunked.dry_run()["chunked_gather_workloads"]  # raises on a refused plan, a byte count or grid that is off, no cubin
    # issue 27's nine workloads x (cp_gather fp8, dequant auto bf16, dequant fp8 -> bf16) x seq_starts off/on
    assert {p["workload"] for p in plans} == {"1x65536", "1x131072", "8x16384", "64x2048", "256x1000", "1024x256",
                                              "4096x64", "1x1000", "8x100"}
    assert len(plans) == 54 and len({(p["workload"], p["variant"], p["seq_starts"]) for p in plans}) == 54
    per_token = {"cp_gather fp8": (1152, "copy"), "dequant auto bf16": (2304, "copy"),
                 "dequant fp8->bf16": (1728, "e4m3_bf16")}  # bytes read + written per token
    for p in plans:
        assert (p["bytes"], p["conversion"]) == (p["tokens"] * per_token[p["variant"]][0], per_token[p["variant"]][1])
        assert p["tasks"] <= p["baseline_grid"], p
    # with seq_starts the pages are partial at both ends: more tasks than without
    tasks = {(p["workload"], p["variant"], p["seq_starts"]): p["tasks"] for p in plans}
    assert tasks["4096x64", "cp_gather fp8", True] > tasks["4096x64", "cp_gather fp8", False]


def test_dry_run_from_the_command_line(run_bench):
    r = run_bench("--dry-run", "--families", "chunked")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.startswith("chunked: 54 chunked_gather_workloads planned, baselines compiled for sm_90"), \
        r.stdout[:500]


# (variant index, case arguments): ragged requests with empty ones, seq_starts, rows past the last
# request (cp_gather_cache leaves them), num_tokens below cu[-1] (the dequantizing gather cuts)
CASES = [
    (0, dict(lens=[5, 0, 70, 33, 1], block_size=16, seq_starts=True, extra_rows=3)),
    (0, dict(lens=[64, 64, 0, 130], block_size=64)),
    (1, dict(lens=[40, 0, 17, 90], block_size=16, seq_starts=True, src_dtype=torch.bfloat16, cut_rows=11)),
    (1, dict(lens=[200], block_size=64, src_dtype=torch.bfloat16)),
    (2, dict(lens=[33, 7, 0, 91, 2], block_size=16, seq_starts=True, conversion="e4m3_bf16", cut_rows=5)),
    (2, dict(lens=[130, 1], block_size=64, conversion="e4m3_bf16")),
]


@pytest.mark.parametrize("variant, kw", CASES)
def test_the_baseline_is_byte_exact_on_the_emulator(chunked, tmp_path_factory, variant, kw):
    dll = emulator(tmp_path_factory, kernel="baseline_cache_gather", modules=[chunked.BASELINE])
    label, op, kv_cache_dtype, _, _, entry = chunked.VARIANTS[variant]
    case = make_case(random.Random(hash(str(kw)) & 0xFFFF), **kw)
    args = case.cp_args() if op == "cp_gather_cache" else case.dequant_args(kv_cache_dtype)
    p = cache_gather.plan_for(op, *args)
    assert p.entry_stride == p.row_bytes and p.dst_row_stride == p.dst_row_bytes  # what the baseline takes
    fields = dict(src_cache=p.src_ptr, dst=p.dst_ptr, block_table=p.bt_ptr, cu_seq_lens=p.cu_ptr,
                  seq_starts=p.seq_ptr, scale=case.scale.data_ptr(), block_stride=p.block_stride,
                  entry_stride=p.entry_stride, dst_row_stride=p.dst_row_stride, bt_row_stride=p.bt_row_stride,
                  num_rows=p.num_rows, batch=p.batch, block_size=p.block_size, max_blocks=p.max_blocks,
                  row_bytes=p.row_bytes, unused=0)
    grid = -(-p.num_rows // p.block_size) + 2 * p.batch
    emu_launch(dll, chunked.BASELINE_PARAMS, entry, grid, fields)
    assert torch.equal(case.dst_store, reference(case)), (label, case.desc)


def test_a_row_prints_and_lands_in_the_record_tables(chunked):
    """The row the record holds (chunked_gather_workloads) and the line printed for it, from
    made-up timings: the ratios, the targets (1.1x the copy from 64K tokens, 1.3x below, faster
    than the baseline) and the markdown table."""
    import timing

    def row(tokens, op, copy, base):
        r = {"workload": "1x65536", "variant": "cp_gather fp8", "seq_starts": True, "requests": 1, "tokens": tokens,
             "bytes": tokens * 1152, "op_us": op, "copy_us": copy, "baseline_us": base,
             "op_spread_us": [op - 1, op + 1], "baseline_spread_us": [base - 1, base + 1]}
        return chunked.targets(timing.ratios(r))
    fast, slow_small, beaten = row(65536, 33.0, 30.0, 40.0), row(1000, 6.6, 5.0, 9.0), row(65536, 31.0, 30.0, 30.5)
    assert fast["target_over_copy"] == 1.1 and fast["meets_targets"]
    assert slow_small["target_over_copy"] == 1.3 and not slow_small["meets_targets"]  # 1.32x the copy
    assert not beaten["meets_targets"]  # within 1.1x, but the baseline is faster
    met = [t for t, _ in chunked.TABLE.columns].index("met")
    assert chunked.TABLE.line(fast).split(" | ")[met] == "yes"
    assert chunked.TABLE.line(slow_small).split(" | ")[met] == "no"
    md = chunked.markdown({"chunked_gather_workloads": [fast, slow_small]})
    assert md[1].startswith("| chunked gather (requests x context) | variant | seq_starts |") and len(md) == 5
    assert md[3] == "| 1x65536 | cp_gather fp8 | yes | 65536 | 75.5 | 30.0 | 33.0 | 1.10 | 40.0 | 1.33 | 1.1 | yes | " \
                    "32.0-34.0 |", md[3]
