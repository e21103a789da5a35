"""Links a reader follows (issue 36, item 11): every Markdown link in the repository's own
documents is relative and resolves to a file of the checkout, and the package metadata names no
URL (the project has no public address to point to)."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_document_link_is_relative_and_resolves():
    bad = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            path = target.split("#")[0]
            if "://" in target or target.startswith("//"):
                bad.append(f"{doc.relative_to(ROOT)}: {target} (an address outside the checkout)")
            elif path and not (doc.parent / path).exists():
                bad.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
    assert not bad, "\n".join(bad)


def test_package_metadata_invents_no_url():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "urls" not in project, project["urls"]
    assert "://" not in str({k: v for k, v in project.items() if k != "dependencies"}), project
