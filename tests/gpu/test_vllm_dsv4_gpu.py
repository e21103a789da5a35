"""vLLM's DeepSeek-V4 gather replaced by the plugin, on the GPU: on a stand-in vLLM tree
(tests/helpers/vllm_dsv4_standin.py, vLLM 0.33's layout and import order), a call through the
backend's patched name is one launch of our kernel, no host sync, vLLM's function never
reached, and the rows are the reference's bytes (untouched rows stay poisoned)."""
import textwrap

import pytest
import torch

from helpers import vllm_dsv4_standin as standin
from helpers.fresh_python import run

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


def test_a_call_through_the_patched_name_is_one_launch_of_our_kernel(tmp_path):
    root = standin.build(str(tmp_path), "0.33")
    got = run(textwrap.dedent("""
        import json, torch
        from nvrtc_gather.integrations import vllm as adapter
        adapter.plugin()
        import vllm.models.deepseek_v4
        from vllm.models.deepseek_v4.nvidia import flashmla
        from vllm.models.deepseek_v4.common.ops import CALLS
    """) + textwrap.dedent(standin.CASE) + textwrap.dedent("""
        res = {}
        for label, kw in (("swa", dict(bs=64, seq=(700, 0, 65, 9), offset=5)),
                          ("compressed", dict(bs=16, seq=(175, 3, 40), with_gather_lens=False, offset=0))):
            args, want = case("cuda", **kw)
            flashmla.call(*args)  # loads the kernel
            torch.cuda.synchronize()
            args[0].view(torch.uint8).fill_(0xA5)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    flashmla.call(*args[:2], seq_lens=args[2], gather_lens=args[3], block_table=args[4],
                                  block_size=args[5], offset=args[6])
            finally:
                torch.cuda.set_sync_debug_mode(0)
            torch.cuda.synchronize()
            kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            res[label] = {"kernels": kernels,
                          "bytes": torch.equal(args[0].cpu().view(torch.int16), want.view(torch.int16))}
        res["vllm calls"] = CALLS
        print(json.dumps(res))
    """), path=[root], timeout=600)
    for label in ("swa", "compressed"):
        assert got[label]["kernels"] == ["dsv4_paged_bf16"], got[label]
        assert got[label]["bytes"], label
    assert got["vllm calls"] == [], got
