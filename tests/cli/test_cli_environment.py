"""The CLI whatever the environment says: TORCH_CUDA_ARCH_LIST as GPU images set it, a cache
built by another NVRTC, cache paths that cannot be checked, a home that cannot be found,
boolean variables with values they do not take; and `info` for a serving engineer."""
import json
import os

import pytest

from nvrtc_gather import cli
from nvrtc_gather.cli import info
from nvrtc_gather.jit import build, compiler, cubin_cache, cuda_packages, driver, spec
from nvrtc_gather.kernels import gather as gather_kernels
from nvrtc_gather import kernels

ONE = (gather_kernels.MODULES[16],)  # one module keeps the compiles short; the logic is per module


@pytest.fixture
def one_module(monkeypatch):
    monkeypatch.setattr(spec, "registered", lambda: ONE)


def _run(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    return rc, out.out, out.err


# -- warmup warms what the GPUs load -------------------------------------------------------------

def test_arch_list_with_suffixes_is_warmed_as_the_gpus_load_it(tmp_path, monkeypatch, capsys, one_module):
    """TORCH_CUDA_ARCH_LIST="9.0a 10.0": an H200 loads sm_90, so that is what must be in the cache."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a 10.0")
    rc, out, _ = _run(capsys, "warmup", "--cache-dir", str(tmp_path), "--no-progress")
    assert rc == 0
    assert {e.arch for e in cubin_cache.DiskCache(tmp_path).scan().images} == {"sm_90", "sm_100"}
    assert "9.0a is warmed as sm_90" in out
    # what the runtime looks up for a GPU of capability 9.0 is there, so nothing compiles
    monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", str(tmp_path))
    hits, compiles = build.stats["disk_hits"], build.stats["compiles"]
    image = build.image_for(gather_kernels.MODULES[16], 90, lambda image: image)
    assert image[:4] == b"\x7fELF" and build.stats["disk_hits"] == hits + 1 and build.stats["compiles"] == compiles


def test_explicit_arch_specific_name_says_what_it_warms(tmp_path, capsys, one_module):
    rc, out, _ = _run(capsys, "warmup", "--arch", "sm_90a", "--cache-dir", str(tmp_path), "--no-progress")
    assert rc == 0 and "sm_90a is warmed as sm_90" in out and "no arch-specific instructions" in out
    assert {e.arch for e in cubin_cache.DiskCache(tmp_path).scan().images} == {"sm_90"}


# -- verify proves a cache can serve -------------------------------------------------------------

def test_verify_reports_stale_entries_and_arch_proves_serving(tmp_path, monkeypatch, capsys, one_module):
    real_identity = compiler.compiler_identity
    monkeypatch.setattr(compiler, "compiler_identity", lambda: "nvidia-cuda-nvrtc 12.0.0 (another install)")
    assert _run(capsys, "warmup", "--arch", "sm_90", "--cache-dir", str(tmp_path), "--no-progress")[0] == 0
    monkeypatch.setattr(compiler, "compiler_identity", real_identity)

    rc, out, _ = _run(capsys, "cache", "verify", "--cache-dir", str(tmp_path))
    assert rc == 0 and "STALE" in out and "1 of them stale" in out  # intact, but never loaded here
    rc, out, _ = _run(capsys, "cache", "verify", "--arch", "sm_90", "--cache-dir", str(tmp_path))
    assert rc == 1 and "would NOT serve sm_90" in out and f"missing: {gather_kernels.MODULES[16].name}" in out
    assert f"nvrtc-gather warmup --arch sm_90 --cache-dir {tmp_path}" in out

    assert _run(capsys, "warmup", "--arch", "9.0", "--cache-dir", str(tmp_path), "--no-progress")[0] == 0
    rc, out, _ = _run(capsys, "cache", "verify", "--arch", "sm_90a", "--cache-dir", str(tmp_path))
    assert rc == 0 and "serves sm_90 without compiling" in out
    rc, out, _ = _run(capsys, "cache", "verify", "--arch", "sm_100", "--cache-dir", str(tmp_path))
    assert rc == 1 and "0 of 1 kernel modules present" in out


def test_verify_arch_counts_every_module_the_ops_load(tmp_path, capsys):
    """Without --arch's proof a partly warmed cache looked fine: one module short fails it."""
    disk = cubin_cache.DiskCache(tmp_path)
    t = compiler.Target("sm_90")
    for m in kernels.ALL_MODULES[:-1]:
        built = build.build_image(m, t, disk=disk, compile_ok=True)
        assert built.image
    rc, out, _ = _run(capsys, "cache", "verify", "--arch", "sm_90", "--cache-dir", str(tmp_path))
    assert rc == 1 and f"missing: {kernels.ALL_MODULES[-1].name}" in out


# -- paths that cannot be checked, a home that cannot be found -----------------------------------

def _unreadable_paths(tmp_path):
    yield "name too long", str(tmp_path / ("x" * 300) / "cache")
    if os.geteuid() != 0:  # root searches any directory
        locked = tmp_path / "locked"
        (locked / "cache").mkdir(parents=True)
        locked.chmod(0)
        yield "no search permission", str(locked / "cache")


@pytest.mark.parametrize("command", [["cache", "list"], ["cache", "verify"], ["info"]])
def test_cache_path_that_cannot_be_checked_is_reported_not_a_traceback(command, tmp_path, monkeypatch, capsys):
    for what, path in _unreadable_paths(tmp_path):
        monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", path)
        rc, out, err = _run(capsys, *command)
        assert ("cannot check it" in out + err or "cannot list" in err), (what, out, err)
        assert rc == (0 if command[-1] in ("list", "info") else 1), what
    if os.geteuid() != 0:
        (tmp_path / "locked").chmod(0o700)


@pytest.mark.parametrize("command", [["cache", "list"], ["cache", "verify"], ["cache", "clear"],
                                     ["warmup", "--arch", "sm_90"]])
def test_unknown_home_is_a_message_naming_what_to_set(command, monkeypatch, capsys):
    monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", "~nosuchuser_nvrtc/cache")
    rc, _, err = _run(capsys, *command)
    assert rc == 2 and "NVRTC_GATHER_CACHE_DIR" in err and "cannot expand" in err


def test_info_with_an_unknown_home_still_answers(monkeypatch, capsys):
    monkeypatch.setenv("NVRTC_GATHER_CACHE_DIR", "~nosuchuser_nvrtc/cache")
    rc, out, _ = _run(capsys, "info")
    assert rc == 0 and "unknown" in out and "kept in memory" in out


@pytest.mark.parametrize("command", [["cache", "list"], ["warmup", "--arch", "sm_90"]])
def test_a_boolean_variable_with_a_bad_value_stops_the_cli_with_its_name(command, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("NVRTC_GATHER_DISABLE_CACHE", "maybe")
    rc, _, err = _run(capsys, *command)
    assert rc == 2 and "NVRTC_GATHER_DISABLE_CACHE='maybe' is not a boolean" in err


# -- info for a serving engineer -----------------------------------------------------------------

def test_info_shows_every_variable_and_warns_of_a_bad_one(monkeypatch, capsys):
    monkeypatch.setenv("NVRTC_GATHER_DISABLE_JIT", "1;")
    rc, out, _ = _run(capsys, "info")
    assert rc == 0
    for name in ("NVRTC_GATHER_CACHE_DIR", "NVRTC_GATHER_DISABLE_CACHE", "NVRTC_GATHER_DISABLE_JIT",
                 "NVRTC_GATHER_DEBUG"):
        assert name in out
    assert "warning: NVRTC_GATHER_DISABLE_JIT='1;' is not a boolean" in out


def test_info_json_is_one_object_for_scripts(monkeypatch, capsys):
    monkeypatch.delenv("NVRTC_GATHER_DISABLE_JIT", raising=False)
    monkeypatch.setattr(driver, "device_count", lambda: 1)
    monkeypatch.setattr(driver, "capability", lambda i: 90)
    monkeypatch.setattr(driver, "device_name", lambda i: "Fake H200")
    monkeypatch.setattr(driver, "driver_version", lambda: 13000)
    rc, out, _ = _run(capsys, "info", "--json")
    doc = json.loads(out)
    assert rc == 0 and set(doc) == {"info", "warnings"}
    assert doc["info"]["GPU 0"].startswith("Fake H200, sm_90 -> loads sm_90")
    assert doc["info"]["NVRTC_GATHER_DISABLE_JIT"].startswith("unset (off)")


def test_info_warns_when_bindings_and_nvrtc_majors_differ(monkeypatch, capsys):
    """torch 2.8 with no extra: cuda-bindings 13 beside NVRTC 12.8, silently."""
    monkeypatch.setattr(cuda_packages, "bindings_major", lambda: 13)
    monkeypatch.setattr(cuda_packages, "nvrtc_wheels", lambda: {12: ("nvidia-cuda-nvrtc-cu12", "12.8.93")})
    rc, out, _ = _run(capsys, "info")
    assert rc == 0 and "warning: cuda-bindings" in out and "nvidia-cuda-nvrtc-cu12 12.8.93" in out
    assert "pip install 'nvidia-cuda-nvrtc-cu12==12.*' 'cuda-bindings>=12.8,<13'" in out


def test_info_matching_majors_do_not_warn(monkeypatch, capsys):
    monkeypatch.setattr(cuda_packages, "bindings_major", lambda: 13)
    monkeypatch.setattr(cuda_packages, "nvrtc_wheels", lambda: {13: ("nvidia-cuda-nvrtc", "13.0.88")})
    assert "warning: cuda-bindings" not in _run(capsys, "info")[1]


def test_verify_arch_does_not_count_a_damaged_file(tmp_path, capsys, one_module):
    """A file under the current key that fails verification does not serve."""
    assert _run(capsys, "warmup", "--arch", "sm_90", "--cache-dir", str(tmp_path), "--no-progress")[0] == 0
    (image,) = cubin_cache.DiskCache(tmp_path).scan().images
    image.path.write_bytes(image.path.read_bytes()[:-1])  # truncated: checksum and length no longer hold
    rc, out, _ = _run(capsys, "cache", "verify", "--arch", "sm_90", "--cache-dir", str(tmp_path))
    assert rc == 1 and "BAD " in out and f"missing: {gather_kernels.MODULES[16].name}" in out


@pytest.mark.parametrize("engine, env, says", [
    ("vLLM", {}, "replaces cp_gather_indexer_k_quant_cache, indexer_k_quant_and_cache"),
    ("vLLM", {"NVRTC_GATHER_VLLM_OPS": "gather"}, "replaces cp_gather_indexer_k_quant_cache in"),
    ("vLLM", {"NVRTC_GATHER_VLLM": "off"}, "switched off by NVRTC_GATHER_VLLM"),
    ("vLLM", {"NVRTC_GATHER_VLLM_OPS": "bogus"}, "INVALID setting"),
    ("SGLang", {}, "replaces GetKAndS.execute, SetKAndS.execute, dequantize_k_cache_paged_dsv4"),
    ("SGLang", {"NVRTC_GATHER_SGLANG_OPS": "dsv4_fp8"}, "replaces gather_dequant_requant_fp8_paged_dsv4 in"),
    ("SGLang", {"NVRTC_GATHER_SGLANG": "0"}, "switched off by NVRTC_GATHER_SGLANG"),
    ("SGLang", {"NVRTC_GATHER_SGLANG_OPS": "bogus"}, "INVALID setting")])
def test_info_says_what_each_plugin_will_do_and_warns_of_a_bad_ops_list(engine, env, says, monkeypatch, capsys):
    ops_env = f"NVRTC_GATHER_{engine.upper()}_OPS"
    for name in ("NVRTC_GATHER_VLLM", "NVRTC_GATHER_VLLM_OPS", "NVRTC_GATHER_SGLANG", "NVRTC_GATHER_SGLANG_OPS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    rc, out, _ = _run(capsys, "info")
    line = next(l for l in out.splitlines() if l.startswith(f"{engine} plugin"))
    assert rc == 0 and says in line, line
    warned = f"warning: {ops_env}='bogus': expected a comma-separated list" in out
    assert warned == (env.get(ops_env) == "bogus"), out
