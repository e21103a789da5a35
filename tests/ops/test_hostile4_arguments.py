"""Round four's smaller argument findings (issue #26 item 7), each refused with a message that
names the argument and the type it got."""
import numpy as np
import pytest
import torch

import nvrtc_gather as ng
from nvrtc_gather import settings
from nvrtc_gather.errors import InvalidSettingError
from helpers.fresh_python import run


def _calls():
    kv = torch.zeros(2, 16, 132, dtype=torch.uint8)
    yield "gather", lambda: ng.cp_gather_indexer_k_quant_cache(
        kv, torch.empty(4, 128, dtype=torch.uint8), torch.empty(4, 4, dtype=torch.uint8),
        torch.tensor([[0]], dtype=torch.int32), torch.tensor([0, 4], dtype=torch.int32))
    yield "quant", lambda: ng.indexer_k_quant_and_cache(torch.randn(2, 128), kv, torch.tensor([0, 1]), 128, "ue8m0")
    yield "mla_write", lambda: ng.concat_and_cache_mla(
        torch.randn(2, 512, dtype=torch.bfloat16), torch.randn(2, 64, dtype=torch.bfloat16),
        torch.zeros(1, 16, 656, dtype=torch.uint8), torch.tensor([0, 1]), "fp8_ds_mla", torch.ones(1))
    yield "mla_gather", lambda: ng.cp_gather_and_upconvert_fp8_kv_cache(
        torch.zeros(1, 16, 656, dtype=torch.uint8), torch.empty(4, 576, dtype=torch.bfloat16),
        torch.tensor([[0]], dtype=torch.int32), torch.tensor([0], dtype=torch.int32), 1)


@pytest.mark.parametrize("name,call", list(_calls()), ids=[n for n, _ in _calls()])
def test_a_bad_debug_setting_is_refused_on_cpu_calls_too(name, call, monkeypatch):
    call()  # fine while unset
    monkeypatch.setenv(settings.DEBUG_ENV, "maybe")
    with pytest.raises(InvalidSettingError, match=settings.DEBUG_ENV):
        call()
    monkeypatch.setenv(settings.DEBUG_ENV, "0")
    call()


def test_skip_scale_of_numpy_bool_names_the_numpy_type():
    with pytest.raises(TypeError, match=r"skip_scale: expected a bool, got numpy\.bool"):
        ng.concat_and_cache_mla(torch.randn(2, 8), torch.randn(2, 8), torch.zeros(1, 16, 16, dtype=torch.uint8),
                                torch.tensor([0, 1]), "fp8", torch.ones(1), np.True_)


def test_a_tensor_argument_of_a_numpy_array_names_the_numpy_type():
    with pytest.raises(TypeError, match=r"k: expected a torch\.Tensor, got numpy\.ndarray"):
        ng.indexer_k_quant_and_cache(np.zeros((2, 128), np.float32), torch.zeros(2, 16, 132, dtype=torch.uint8),
                                     torch.tensor([0, 1]), 128, "ue8m0")


def test_vllm_register_of_a_non_iterable_names_the_argument():
    got = run("""
        import json
        from nvrtc_gather.integrations import vllm
        out = {}
        for bad in (123, [1, 2], None.__class__):
            try:
                vllm.register(bad)
                out[repr(bad)] = "accepted"
            except TypeError as exc:
                out[repr(bad)] = str(exc)
        print(json.dumps(out))
    """)
    for bad, msg in got.items():
        assert msg.startswith("ops: expected op names") and bad in msg, (bad, msg)
