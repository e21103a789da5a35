"""Shipped code (nvrtc_gather/, cuda_src/) states its contracts and measured facts itself: it
never sends the reader to the benchmark history (benchmarks/NOTES.md, or a version of it such
as "v14"), which is not shipped and is rewritten run by run."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [p for d in ("nvrtc_gather", "cuda_src") for p in sorted((ROOT / d).rglob("*"))
           if p.suffix in (".py", ".cu", ".cuh")]
# "NOTES.md" or "NOTES" anywhere, or a history version cited in parentheses ("(v14)", ", v13)").
HISTORY = re.compile(r"NOTES\.md|\bNOTES\b|[(,;]\s*v\d{1,2}\)")


def test_there_are_shipped_files_to_scan():
    assert len(SHIPPED) > 30, SHIPPED


def test_shipped_code_cites_no_benchmark_history():
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in SHIPPED
            for n, line in enumerate(p.read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not hits, "shipped code cites the benchmark history; state the fact itself:\n" + "\n".join(hits)
