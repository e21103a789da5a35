"""The vLLM-style kernels of benchmarks/baselines.py that find their (request, page) task by a
serial scan (the MLA gather's and the chunked gathers') run on the host emulator, byte-exact
against the independent references (tests/helpers/cache_gather_reference.py,
mla_reference.py), so that the H200 run does not find a broken baseline only when it checks it."""
import random

import pytest
import torch

from helpers.cache_gather_reference import make_case, reference
from helpers.host_emu import emu_launch, emulator
from helpers.mla_reference import gather_reference, make_gather_case
from nvrtc_gather.ops import cache_gather, mla_gather


@pytest.fixture(scope="module")
def baselines(bench):
    import baselines
    return baselines


def _emulated(tmp_path_factory, module):
    return emulator(tmp_path_factory, kernel=module.name, modules=[module])


# (entry, case arguments): ragged requests with empty ones, seq_starts, rows past the last
# request (cp_gather_cache leaves them), num_tokens below cu[-1] (the dequantizing gather cuts)
CASES = [
    ("baseline_cp_gather", dict(lens=[5, 0, 70, 33, 1], block_size=16, seq_starts=True, extra_rows=3)),
    ("baseline_cp_gather", dict(lens=[64, 64, 0, 130], block_size=64)),
    ("baseline_dequant_auto_bf16", dict(lens=[40, 0, 17, 90], block_size=16, seq_starts=True,
                                        src_dtype=torch.bfloat16, cut_rows=11)),
    ("baseline_dequant_auto_bf16", dict(lens=[200], block_size=64, src_dtype=torch.bfloat16)),
    ("baseline_dequant_fp8_bf16", dict(lens=[33, 7, 0, 91, 2], block_size=16, seq_starts=True,
                                       conversion="e4m3_bf16", cut_rows=5)),
    ("baseline_dequant_fp8_bf16", dict(lens=[130, 1], block_size=64, conversion="e4m3_bf16")),
]


@pytest.mark.parametrize("entry, kw", CASES)
def test_the_chunked_baseline_is_byte_exact_on_the_emulator(baselines, tmp_path_factory, entry, kw):
    case = make_case(random.Random(hash(str(kw)) & 0xFFFF), **kw)
    op = "cp_gather_cache" if entry == "baseline_cp_gather" else "gather_and_maybe_dequant_cache"
    args = case.cp_args() if op == "cp_gather_cache" else case.dequant_args("fp8" if "fp8" in entry else "auto")
    p = cache_gather.plan_for(op, *args)
    assert p.entry_stride == p.row_bytes and p.dst_row_stride == p.dst_row_bytes  # what the baseline takes
    grid = baselines.page_task_grid(p.num_rows, p.block_size, p.batch)
    emu_launch(_emulated(tmp_path_factory, baselines.CHUNKED), baselines.PAGE_TASK_PARAMS, entry, grid,
               baselines.page_tasks(p, p.cu_ptr, case.scale.data_ptr(), p.row_bytes))
    assert torch.equal(case.dst_store, reference(case)), (entry, case.desc)


@pytest.mark.parametrize("kw", [dict(lens=[5, 0, 70, 33, 1], block_size=16, seq_starts=True),
                                dict(lens=[64, 64, 0, 130], block_size=64, seq_starts=False),
                                dict(lens=[1, 200], block_size=64, seq_starts=True)])
def test_the_mla_gather_baseline_is_byte_exact_on_the_emulator(baselines, tmp_path_factory, kw):
    case = make_gather_case(random.Random(len(kw["lens"])), first_row=0, **kw)
    p = mla_gather.plan_gather(*case.args())
    # the benchmark's workspace_starts carry one more entry, the row count: the baseline reads it
    cu = torch.tensor(case.workspace_starts.tolist()[:case.batch] + [p.num_rows], dtype=torch.int32)
    grid = baselines.page_task_grid(p.num_rows, p.block_size, p.batch)
    emu_launch(_emulated(tmp_path_factory, baselines.MLA_GATHER), baselines.PAGE_TASK_PARAMS, "baseline_mla_gather", grid,
               baselines.page_tasks(p, cu.data_ptr()))
    assert torch.equal(case.dst_store, gather_reference(case)), case.desc
