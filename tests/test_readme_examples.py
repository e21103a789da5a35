"""The README's examples run as written (issue 25, item 5): every block marked
``<!-- example: NAME -->`` is a ```python block followed by a ```text block with what it prints;
each runs in a fresh interpreter, from an empty directory, on CPU, and must exit 0 printing
exactly that text. Every other ```python block is marked ``<!-- fragment: WHY -->`` on the line
before it (issue 36, item 9): a reader can tell what runs as written from what does not."""
import os
import re
import subprocess
import sys

import pytest

from helpers.fresh_python import REPO

EXAMPLE = re.compile(r"<!-- example: (?P<name>\w+) -->\n```python\n(?P<code>.*?)\n```\n```text\n(?P<out>.*?)\n```",
                     re.S)


def _examples() -> dict[str, tuple[str, str]]:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    found = {m["name"]: (m["code"], m["out"]) for m in EXAMPLE.finditer(text)}
    assert len(found) == text.count("<!-- example: "), "a marked example is not a python block + text block"
    return found


FRAGMENT = re.compile(r"<!-- fragment: [^\n>]*\w[^\n>]* -->\n```python\n")  # names why, on one line


def test_every_python_block_is_an_example_or_a_marked_fragment():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    blocks = text.count("```python\n")
    examples, fragments = len(_examples()), len(FRAGMENT.findall(text))
    unmarked = [text[max(0, m.start() - 200): m.start() + 80] for m in re.finditer(r"```python\n", text)
                if not re.search(r"(<!-- example: \w+ -->|<!-- fragment: [^\n>]*\w[^\n>]* -->)\n$", text[:m.start()])]
    assert not unmarked and examples + fragments == blocks, "unmarked python blocks:\n" + "\n---\n".join(unmarked)


def test_every_op_has_an_example():
    assert {"gather", "quant", "mla_write", "mla_gather"} <= set(_examples())


@pytest.mark.parametrize("name", sorted(_examples()))
def test_example_runs_as_written(name, tmp_path):
    code, want = _examples()[name]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVRTC_GATHER_")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # as on a CPU machine, even on the GPU one
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == want + "\n", r.stdout
