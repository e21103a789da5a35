"""Round five of hostile input against the CLI's settings (issue 36, item 7): warmup under
NVRTC_GATHER_DISABLE_JIT, a bad ``cache verify --arch``, and ``info`` with the vLLM plugin
installed but NVRTC unusable. Each case answered wrongly before its fix."""
from importlib import metadata

import pytest

from nvrtc_gather import cli
from nvrtc_gather.errors import MissingDependencyError
from nvrtc_gather.jit import compiler, driver


def _run(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return rc, out.out, out.err


@pytest.mark.parametrize("value", ["1", "yes", "maybe"])
def test_warmup_refuses_to_run_when_compiling_is_disabled(value, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("NVRTC_GATHER_DISABLE_JIT", value)
    rc, out, err = _run(capsys, "warmup", "--arch", "sm_90", "--cache-dir", str(tmp_path), "--no-progress")
    assert rc == 2 and "NVRTC_GATHER_DISABLE_JIT" in err and out == "", (out, err)
    assert not any(tmp_path.iterdir())  # nothing compiled


def test_warmup_runs_when_compiling_is_explicitly_allowed(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("NVRTC_GATHER_DISABLE_JIT", "0")
    monkeypatch.setattr("nvrtc_gather.jit.spec.registered", lambda: [])  # nothing to compile: quick
    rc, out, err = _run(capsys, "warmup", "--arch", "sm_90", "--cache-dir", str(tmp_path), "--no-progress")
    assert rc == 0 and "0 images" in out, (out, err)


@pytest.mark.parametrize("arch", ["sm_5", "sm90x", "banana"])
def test_verify_with_an_unreadable_arch_is_a_usage_error(arch, capsys, tmp_path):
    rc, out, err = _run(capsys, "cache", "verify", "--arch", arch, "--cache-dir", str(tmp_path))
    assert rc == 2 and "--arch" in err and arch in err, (out, err)
    assert out == ""  # refused before anything is checked


class _EntryPoint:
    name = "nvrtc_gather"


def _plugin_installed(monkeypatch, nvrtc_usable: bool):
    real = metadata.entry_points
    monkeypatch.setattr(metadata, "entry_points",
                        lambda **kw: [_EntryPoint()] if kw.get("group") == "vllm.general_plugins" else real(**kw))
    if not nvrtc_usable:
        def missing():
            raise MissingDependencyError("the NVRTC library could not be loaded (test)")
        monkeypatch.setattr(compiler, "nvrtc_version", missing)

    def no_driver():
        raise MissingDependencyError("no usable NVIDIA driver was found (test)")
    monkeypatch.setattr(driver, "device_count", no_driver)
    monkeypatch.setattr(driver, "driver_version", no_driver)
    for name in ("NVRTC_GATHER_VLLM", "NVRTC_GATHER_VLLM_OPS"):
        monkeypatch.delenv(name, raising=False)


def test_info_warns_when_the_plugin_is_on_but_nvrtc_is_unusable(monkeypatch, capsys):
    _plugin_installed(monkeypatch, nvrtc_usable=False)
    rc, out, _ = _run(capsys, "info")
    assert rc == 0
    warnings = [l for l in out.splitlines() if l.startswith("warning: the vLLM plugin")]
    assert len(warnings) == 1 and "NVRTC is not usable" in warnings[0] and "NVRTC_GATHER_VLLM=0" in warnings[0], out


@pytest.mark.parametrize("nvrtc_usable, env", [(True, {}), (False, {"NVRTC_GATHER_VLLM": "0"})])
def test_info_does_not_warn_where_the_plugin_will_work_or_is_off(nvrtc_usable, env, monkeypatch, capsys):
    _plugin_installed(monkeypatch, nvrtc_usable)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    rc, out, _ = _run(capsys, "info")
    assert rc == 0 and "warning: the vLLM plugin" not in out, out
