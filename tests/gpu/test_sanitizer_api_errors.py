"""Under compute-sanitizer with CUDA API errors reported (its default), a process that loads
and runs our ops shows no API error that the same process without them does not: the driver
layer binds its entry points by name, so nothing of ours asks cuGetProcAddress for a symbol
the driver lacks (cuda.bindings' driver module resolves its whole table on first use)."""
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from helpers.fresh_python import REPO, TESTS

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

# The same torch work in both processes; OURS adds the ops (first load, then a launch).
TORCH_ONLY = """
import torch
kv = torch.randint(0, 256, (4, 64, 132), dtype=torch.uint8, device="cuda")
dst_k = torch.empty(100, 128, dtype=torch.uint8, device="cuda"); dst_s = torch.empty(100, 4, dtype=torch.uint8, device="cuda")
bt = torch.tensor([[2, 0]], dtype=torch.int32, device="cuda"); cu = torch.tensor([0, 100], dtype=torch.int32, device="cuda")
{ops}
torch.cuda.synchronize()
"""
OURS = "import nvrtc_gather\nnvrtc_gather.cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu)"
ERROR = re.compile(r"Program hit (\w+) .*?on CUDA API call to (\w+)")


def _api_errors(ops: str, tmp_path) -> list[tuple[str, str]]:
    r = subprocess.run(["compute-sanitizer", "--tool", "memcheck", "--report-api-errors", "all",
                        sys.executable, "-c", TORCH_ONLY.format(ops=ops)],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": f"{TESTS}:{REPO}",
                            "NVRTC_GATHER_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return ERROR.findall(r.stdout + r.stderr)


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="compute-sanitizer is not installed")
def test_our_ops_add_no_cuda_api_error_under_the_sanitizer(tmp_path):
    baseline, ours = _api_errors("", tmp_path), _api_errors(OURS, tmp_path)
    extra = list(ours)
    for e in baseline:
        if e in extra:
            extra.remove(e)
    assert extra == [], f"API errors only with our ops: {extra[:10]} ({len(extra)}); torch alone: {len(baseline)}"
