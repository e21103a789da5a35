"""settings.py: boolean variables read strictly, and a cache directory that cannot be
determined (no home, a '~user' that does not exist) falls back to memory, never a traceback."""
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvrtc_gather import settings
from nvrtc_gather.errors import CacheLocationError, InvalidSettingError, JitDisabledError
from nvrtc_gather.jit import build, compiler, cubin_cache, runtime
from nvrtc_gather.kernels import gather as gather_kernels

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("value, expected", [
    ("1", True), ("true", True), ("YES", True), (" on ", True),
    ("0", False), ("false", False), ("No", False), ("off", False), ("", False), (None, False),
])
def test_boolean_spellings(value, expected):
    assert settings.parse_flag("NVRTC_GATHER_X", value) is expected


@pytest.mark.parametrize("name", settings.BOOLEAN_VARIABLES)
@pytest.mark.parametrize("value", ["2", "y", "enable", "1;", "tru"])
def test_a_boolean_it_does_not_understand_is_an_error_naming_the_variable(name, value, monkeypatch):
    monkeypatch.setenv(name, value)
    from nvrtc_gather.integrations import activation, sglang_activation
    reader = {settings.DISABLE_CACHE_ENV: settings.disk_cache_enabled, settings.DISABLE_JIT_ENV: settings.jit_disabled,
              settings.DEBUG_ENV: settings.debug_enabled, settings.VLLM_ENV: activation.vllm_enabled,
              settings.SGLANG_ENV: sglang_activation.sglang_enabled}[name]
    with pytest.raises(InvalidSettingError, match=name) as e:
        reader()
    assert isinstance(e.value, ValueError) and repr(value) in str(e.value)


def test_disable_jit_with_a_bad_value_fails_at_the_first_load_even_on_a_cache_hit(monkeypatch):
    """It used to mean "compile" silently; now the first kernel load raises, before any driver call."""
    monkeypatch.setattr(runtime, "_loaded", {})
    monkeypatch.setenv(settings.DISABLE_JIT_ENV, "2")
    with pytest.raises(InvalidSettingError, match=settings.DISABLE_JIT_ENV):
        runtime.load(gather_kernels.MODULES[16], 0)


def test_disable_jit_with_a_bad_value_never_compiles(monkeypatch, tmp_path):
    monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(settings.DISABLE_JIT_ENV, "enable")
    before = build.stats["compiles"]
    with pytest.raises(InvalidSettingError):
        build.build_image(gather_kernels.MODULES[16], compiler.Target("sm_90"))
    assert build.stats["compiles"] == before


def _no_home(monkeypatch):
    """A uid without a passwd entry and no HOME (a container started with --user 12345)."""
    import pwd

    def missing(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("NVRTC_GATHER_CACHE_DIR", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", missing)


@pytest.mark.parametrize("how", ["no home", "~nosuchuser"])
def test_cache_dir_that_cannot_be_determined_is_a_clear_error(how, monkeypatch):
    if how == "no home":
        _no_home(monkeypatch)
    else:
        monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", "~nosuchuser_nvrtc/x")
    with pytest.raises(CacheLocationError, match="NVRTC_GATHER_CACHE_DIR"):
        settings.cache_dir()


@pytest.mark.parametrize("how", ["no home", "~nosuchuser"])
def test_ops_fall_back_to_memory_with_one_warning(how, monkeypatch, caplog):
    if how == "no home":
        _no_home(monkeypatch)
    else:
        monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", "~nosuchuser_nvrtc/x")
    monkeypatch.setattr(cubin_cache, "_location_warned", set())
    with caplog.at_level(logging.WARNING, logger="nvrtc_gather"):
        assert cubin_cache.current() is None
        assert cubin_cache.current() is None
        built = build.build_image(gather_kernels.MODULES[16], compiler.Target("sm_90"))
    assert built.image[:4] == b"\x7fELF" and not built.from_cache
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "kept in memory" in warnings[0].getMessage()


def test_jit_disabled_without_a_cache_says_why(monkeypatch):
    monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", "~nosuchuser_nvrtc/x")
    monkeypatch.setenv(settings.DISABLE_JIT_ENV, "1")
    with pytest.raises(JitDisabledError, match="cannot expand") as e:
        build.build_image(gather_kernels.MODULES[16], compiler.Target("sm_90"))
    assert "None" not in str(e.value)


def test_cli_override_wins_and_is_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert settings.cache_dir("rel") == tmp_path / "rel"


def test_describe_lists_every_variable_and_flags_bad_values(monkeypatch):
    monkeypatch.setenv(settings.DEBUG_ENV, "maybe")
    monkeypatch.setenv("NVRTC_GATHER_DISABLE_JTI", "1")
    rows = dict(settings.describe())
    assert set(settings.VARIABLES) <= set(rows)
    assert "INVALID" in rows[settings.DEBUG_ENV]
    assert "typo" in rows["NVRTC_GATHER_DISABLE_JTI"]


def test_the_vllm_ops_variable_names_every_op_the_plugin_can_replace():
    """``nvrtc-gather info`` describes NVRTC_GATHER_VLLM_OPS from this text: it must name every
    short name the variable accepts (integrations/activation.py), and no other."""
    import re

    from nvrtc_gather.integrations import activation

    text = settings.VARIABLES[settings.VLLM_OPS_ENV]
    listed = re.findall(r"[a-z_][a-z0-9_]*", text.split(":", 1)[1].split("(")[0])  # the names before "(default ...)"
    assert listed == list(activation.SHORT_NAMES), text


def test_nothing_is_printed_when_the_application_configured_no_logging(tmp_path):
    """The cache-fallback warning must not reach stderr through logging's last-resort handler."""
    code = ("from nvrtc_gather.jit import build, compiler\nfrom nvrtc_gather.kernels import gather as gather_kernels\n"
            "build.build_image(gather_kernels.MODULES[16], compiler.Target('sm_90'))\n")
    env = dict(os.environ, NVRTC_GATHER_CACHE_DIR="~nosuchuser_nvrtc/x")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "" and r.stdout == ""


def test_the_sglang_ops_variable_names_every_op_the_plugin_can_hook():
    """The same for NVRTC_GATHER_SGLANG_OPS and integrations/sglang_activation.py (it once said
    "get, set" after the DeepSeek-V4 gathers joined)."""
    import re

    from nvrtc_gather.integrations import sglang_activation

    text = settings.VARIABLES[settings.SGLANG_OPS_ENV]
    listed = re.findall(r"[a-z_][a-z0-9_]*", text.split(":", 1)[1].split("(")[0])
    assert listed == list(sglang_activation.OPS), text
