import os

import pytest


def _gpu_reason():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch on this machine (these tests run on the H200 via scripts/gpu_check.sh)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory):
    """Tests never touch the user's real kernel cache; one cache for the whole session."""
    if "NVRTC_GATHER_CACHE_DIR" not in os.environ or os.environ.get("NVRTC_GATHER_TEST_KEEP_CACHE") != "1":
        os.environ["NVRTC_GATHER_CACHE_DIR"] = str(tmp_path_factory.mktemp("kernel-cache"))
    yield
