"""The vLLM adapter's chunked-context gathers on CUDA tensors (issue 27): a stand-in for vLLM's
compiled _C_cache_ops with vLLM 0.33's schemas (and an older set), the ops called through
torch.ops._C_cache_ops as vLLM's wrappers call them: our kernels run, bit-exact against the
independent reference, vLLM's kernel is never called for what we serve and gets every argument
of what we do not (tests/helpers/vllm_standin.py; the CPU run of the same scenario is
tests/integrations/test_vllm_chunked.py)."""
import pytest

from helpers import vllm_standin as standin
from helpers.fresh_python import run

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("schema_set", ["0.33", "older"])
def test_stand_in_vllm_library_on_cuda_tensors_runs_our_kernels_bit_exact(schema_set):
    got = run(standin.snippet("cuda", schema_set))
    assert got["schemas"] == "vllm", got
    if schema_set == "0.33":
        assert got["ops"] == ["cp_gather_cache", "gather_and_maybe_dequant_cache"] and got["left"] == {}, got
    else:
        assert got["ops"] == ["cp_gather_cache"] and "gather_and_maybe_dequant_cache" in got["left"], got
    assert got["results"] == standin.expected(schema_set), got
