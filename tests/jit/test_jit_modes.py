"""Operating the JIT in a serving process, without a GPU: what it logs, and
NVRTC_GATHER_DISABLE_JIT (a miss raises instead of compiling)."""
import logging

import pytest

from nvrtc_gather.jit import build, compiler, cubin_cache, runtime
from nvrtc_gather.errors import JitDisabledError
from nvrtc_gather.kernels import gather as gather_kernels

T90 = compiler.Target("sm_90")
# The smallest module keeps these tests fast; every module goes through the same path.
MODULE = gather_kernels.MODULES[16]


def test_compile_logs_info_and_a_hit_logs_debug(tmp_path, caplog):
    disk = cubin_cache.DiskCache(tmp_path / "c")
    with caplog.at_level(logging.DEBUG, logger="nvrtc_gather"):
        build.build_image(MODULE, T90, disk=disk)
    compiled = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(compiled) == 1, caplog.text
    msg = compiled[0].getMessage()
    assert MODULE.name in msg and "sm_90" in msg and " ms " in msg and str(tmp_path / "c") in msg
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="nvrtc_gather"):
        assert build.build_image(MODULE, T90, disk=disk).from_cache
    assert [r.levelno for r in caplog.records] == [logging.DEBUG], caplog.text
    assert "read from the kernel cache" in caplog.records[0].getMessage()


def test_disable_jit_raises_on_a_miss_naming_the_warmup_command(tmp_path, monkeypatch):
    monkeypatch.setenv("NVRTC_GATHER_DISABLE_JIT", "1")
    disk = cubin_cache.DiskCache(tmp_path / "c")
    before = build.stats["compiles"]
    with pytest.raises(JitDisabledError, match=r"nvrtc-gather warmup --arch sm_90 --cache-dir .*/c"):
        build.build_image(MODULE, T90, disk=disk)
    with pytest.raises(JitDisabledError, match="NVRTC_GATHER_DISABLE_JIT"):
        build.build_image(MODULE, T90, disk=None, use_default_cache=False)
    assert build.stats["compiles"] == before
    # The warmup path compiles regardless; then the serving path is served from disk.
    build.build_image(MODULE, T90, disk=disk, compile_ok=True)
    assert build.build_image(MODULE, T90, disk=disk).from_cache
    assert build.stats["compiles"] == before + 1


def test_disable_jit_refuses_warmup_and_0_leaves_it_working(tmp_path, monkeypatch):
    """warmup compiles: under NVRTC_GATHER_DISABLE_JIT=1 it refuses (exit 2, a usage error, as
    demo does); =0 is how an image warms its cache before turning the JIT off."""
    from nvrtc_gather.cli import warmup
    monkeypatch.setenv("NVRTC_GATHER_DISABLE_JIT", "1")
    assert warmup.main(["--arch", "sm_90", "--cache-dir", str(tmp_path / "w"), "--no-progress"]) == 2
    monkeypatch.setenv("NVRTC_GATHER_DISABLE_JIT", "0")
    assert warmup.main(["--arch", "sm_90", "--cache-dir", str(tmp_path / "w"), "--no-progress"]) == 0
