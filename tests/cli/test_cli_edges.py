"""The nvrtc-gather command's edges: version, unknown commands, bad option values."""
import argparse
import io

import pytest

from nvrtc_gather import cli
from nvrtc_gather.jit import compiler
from nvrtc_gather.cli import demo, warmup
from nvrtc_gather._version import __version__


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"nvrtc-gather {__version__}"


def test_unknown_command_says_so(capsys):
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'frobnicate'" in err and "warmup" in err


def test_no_command_prints_usage_and_fails(capsys):
    assert cli.main([]) == 2
    assert "usage: nvrtc-gather COMMAND" in capsys.readouterr().err


@pytest.mark.parametrize("jobs", ["0", "-3", "two"])
def test_warmup_rejects_jobs_below_one(jobs, capsys):
    with pytest.raises(SystemExit) as e:
        warmup.main(["--arch", "sm_90", "-j", jobs])
    assert e.value.code == 2
    assert "-j/--jobs" in capsys.readouterr().err


def test_warmup_takes_torch_cuda_arch_list_when_no_arch_is_given(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX 10.0")
    out = io.StringIO()
    targets = warmup._targets(argparse.Namespace(all=False, arch=None), out)
    assert [t.arch for t in targets] == ["sm_80", "sm_90", "sm_100"]
    assert "TORCH_CUDA_ARCH_LIST" in out.getvalue()
    # --arch wins over the variable
    assert [t.arch for t in warmup._targets(argparse.Namespace(all=False, arch=["86"]), io.StringIO())] == ["sm_86"]


@pytest.mark.parametrize("args,message", [(["--batch", "0"], "--batch: must be at least 1"),
                                          (["--mean-len", "x"], "--mean-len: expected a whole number"),
                                          (["--arch", "sm_9x"], "--arch: cannot read arch 'sm_9x'")])
def test_demo_argument_errors_are_messages_not_tracebacks(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
