"""What a new user meets first (issue #26 item 8): the package summary names every op family,
the README's links work on a package index page (absolute URLs: an index renders the README
without the repository's files), numpy is a dependency (torch warns on every import without
it), --help shows plain text."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_summary_names_the_indexer_and_the_mla_cache_ops():
    summary = PROJECT["description"].lower()
    assert "indexer" in summary and "mla" in summary, summary


def test_numpy_is_a_dependency():
    assert any(re.match(r"numpy\b", d) for d in PROJECT["dependencies"]), PROJECT["dependencies"]


@pytest.mark.parametrize("command", [[], ["demo"], ["warmup"], ["cache"], ["cache", "verify"], ["info"]])
def test_help_is_plain_text(command):
    r = subprocess.run([sys.executable, "-m", "nvrtc_gather", *command, "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr[-2000:]
    assert "`" not in r.stdout, r.stdout
