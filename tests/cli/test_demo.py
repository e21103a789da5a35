"""The README's demo runs (on the CPU here) and reports success."""
from nvrtc_gather.cli import demo


def test_demo_runs_and_checks_itself(capsys):
    assert demo.main(["--batch", "8", "--mean-len", "300"]) == 0
    out = capsys.readouterr().out
    assert "matches a per-request loop: yes" in out or "bit-exact against the torch path: yes" in out
    assert "full cycle" in out and "within fp8-e4m3 tolerance" in out
