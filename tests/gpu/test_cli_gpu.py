"""The command line as a user meets it on a GPU machine: the demo's GPU branch, info's GPU
lines, and warmup from TORCH_CUDA_ARCH_LIST (as GPU images set it) proven by a fresh serving
process with NVRTC_GATHER_DISABLE_JIT=1 that must find every kernel it loads."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nvrtc_gather.cli import demo

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

SERVE = """
import torch, nvrtc_gather
from nvrtc_gather.jit import build
kv = torch.zeros(4, 64, 132, dtype=torch.uint8, device="cuda")
k = torch.randn(100, 128, device="cuda", dtype=torch.bfloat16)
slots = torch.arange(100, device="cuda")
nvrtc_gather.indexer_k_quant_and_cache(k, kv, slots, 128, "ue8m0")
dst_k = torch.empty(100, 128, dtype=torch.float8_e4m3fn, device="cuda")
dst_s = torch.empty(100, 4, dtype=torch.uint8, device="cuda")
bt = torch.arange(4, dtype=torch.int32, device="cuda").view(1, 4)
cu = torch.tensor([0, 100], dtype=torch.int32, device="cuda")
nvrtc_gather.cp_gather_indexer_k_quant_cache(kv, dst_k, dst_s, bt, cu)
nvrtc_gather.preload(torch.cuda.current_device())
torch.cuda.synchronize()
print("compiles", build.stats["compiles"], "disk_hits", build.stats["disk_hits"])
"""


def _cli(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "nvrtc_gather", *argv], capture_output=True, text=True, cwd=ROOT,
                          env=env or dict(os.environ), timeout=600)


def test_demo_gpu_branch(capsys):
    assert demo.main(["--batch", "16", "--mean-len", "500"]) == 0
    out = capsys.readouterr().out
    assert "bit-exact against the torch path: yes" in out and "GB/s" in out
    assert "spare rows past cu_seq_lens[-1] left untouched: yes" in out


def test_demo_as_the_readme_runs_it():
    r = _cli("demo")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bit-exact against the torch path: yes" in r.stdout and "Traceback" not in r.stderr


def test_info_names_the_gpu_and_what_it_loads():
    r = _cli("info")
    cc = "%d%d" % torch.cuda.get_device_capability()
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert f"sm_{cc} -> loads sm_{cc} (cubin)" in r.stdout, r.stdout


def test_warmup_from_the_arch_list_serves_a_process_that_may_not_compile(tmp_path):
    major, minor = torch.cuda.get_device_capability()
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST=f"{major}.{minor}a", NVRTC_GATHER_CACHE_DIR=str(tmp_path))
    env.pop("NVRTC_GATHER_DISABLE_JIT", None)
    r = _cli("warmup", "--no-progress", env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{major}.{minor}a is warmed as sm_{major}{minor}" in r.stdout
    r = _cli("cache", "verify", "--arch", f"sm_{major}{minor}", env=env)
    assert r.returncode == 0 and "without compiling" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-c", SERVE], capture_output=True, text=True, cwd=ROOT, timeout=600,
                       env=dict(env, NVRTC_GATHER_DISABLE_JIT="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[:2] == ["compiles", "0"], r.stdout
