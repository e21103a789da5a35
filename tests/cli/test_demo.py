"""The README's demo: its CPU branch here, its GPU branch's code on CPU tensors through a
stand-in clock and driver (so a crash there cannot hide until someone has a GPU), its inputs,
and its argument bounds."""
import time

import pytest
import torch

from nvrtc_gather.cli import demo
from nvrtc_gather.jit import driver


def test_demo_runs_and_checks_itself(capsys):
    assert demo.main(["--batch", "8", "--mean-len", "300"]) == 0
    out = capsys.readouterr().out
    # the CPU branch here; on a GPU machine the GPU branch (also driven on CPU below)
    assert ("bit-exact against the torch path: yes" if torch.cuda.is_available()
            else "matches a per-request loop: yes") in out
    assert "full cycle" in out and "within fp8-e4m3 tolerance" in out


class FakeClock(demo.CudaClock):
    """torch.cuda's part of the GPU branch, on the CPU."""

    def __init__(self):
        self.timed = 0

    def device_name(self, device):
        return "Fake GPU"

    def synchronize(self):
        pass

    def seconds_per_call(self, fn, calls):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
            self.timed += 1
        return (time.perf_counter() - t0) / calls


def test_gpu_branch_runs_every_line_on_cpu_tensors(monkeypatch, capsys):
    """The branch that crashed on every GPU (AttributeError: 'function' object has no attribute 'stats')."""
    monkeypatch.setattr(driver, "capability", lambda device: 90)
    clock = FakeClock()
    assert demo.main(["--batch", "6", "--mean-len", "200"], clock=clock, device="cpu") == 0
    out = capsys.readouterr().out
    assert "GPU: Fake GPU (sm_90)" in out and "first call" in out and "from disk cache]" in out
    assert "bit-exact against the torch path: yes" in out and "us per call" in out and clock.timed == 20
    assert "spare rows past cu_seq_lens[-1] left untouched: yes" in out


def test_inputs_are_consistent_at_a_large_batch():
    """Built with prefix sums and one gather (the old per-request sums were quadratic: 11 s at 40,000)."""
    (kv, dst_k, dst_s, bt, cu), lens = demo.make_inputs(40000, 3, "cpu")
    assert cu[0] == 0 and torch.equal(cu[1:], torch.tensor(lens).cumsum(0).to(torch.int32))
    blocks = torch.tensor([-(-n // demo.BLOCK_SIZE) for n in lens])
    used = torch.arange(bt.shape[1]).unsqueeze(0) < blocks.unsqueeze(1)
    ids = bt[used]
    assert ids.numel() == int(blocks.sum()) and ids.unique().numel() == ids.numel()  # each block once
    assert int(ids.min()) >= 0 and int(ids.max()) < kv.shape[0] and bool((bt[~used] == 0).all())
    assert dst_k.shape[0] == sum(lens) + 8 == dst_s.shape[0]


@pytest.mark.parametrize("args, message", [
    (["--mean-len", "2000000000"], "--mean-len: must be at most 1048576"),
    (["--batch", "100000"], "--batch: must be at most 65536"),
    (["--batch", "65536", "--mean-len", "4096"], "the demo takes at most 16777216"),
])
def test_hostile_sizes_are_argument_errors(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err
