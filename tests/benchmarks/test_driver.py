"""benchmarks/bench.py without a GPU: every family keeps the contract the driver calls, its dry
run builds exactly the rows of the record (benchmarks/record.json: same workloads, tokens and
bytes), the record writer round-trips the record and renders the tables benchmarks/README.md
shows, and no module of benchmarks/ imports another in a circle (nor a family another family)."""
import ast
import json
from pathlib import Path

from helpers.fresh_python import REPO

BENCH = Path(REPO, "benchmarks")

RECORD = json.loads(Path(BENCH, "record.json").read_text())


def test_every_family_keeps_the_contract(bench):
    names = [f.NAME for f in bench.FAMILIES]
    assert len(set(names)) == len(names) and {"indexer", "mla", "chunked"} <= set(names)
    for fam in bench.FAMILIES:
        assert isinstance(fam.REPS, int) and fam.REPS > 0, fam.NAME
        assert all(callable(getattr(fam, f)) for f in ("bench", "dry_run", "markdown")), fam.NAME
        assert all(k.endswith("_us") for k in getattr(fam, "HOST_RATIOS", ())), fam.NAME
        assert hasattr(fam, "host_calls") or not getattr(fam, "HOST_RATIOS", ()), fam.NAME


def test_the_dry_run_builds_every_row_of_the_record(bench):
    rows = bench.dry_run(bench.FAMILIES)
    sections = {k for k, v in RECORD.items() if isinstance(v, list) and v}
    assert sections <= rows.keys(), sections - rows.keys()  # every table of the record has a family
    for key, planned in rows.items():
        recorded = RECORD[key]
        assert len(planned) == len(recorded), key
        for p, r in zip(planned, recorded):
            assert {"workload", "tokens", "bytes"} <= p.keys() & r.keys(), (key, p)
            assert {k: p[k] for k in p.keys() & r.keys()} == {k: r[k] for k in p.keys() & r.keys()}, (key, p, r)


def test_the_dry_run_from_the_command_line_takes_the_old_skips(run_bench, tmp_path):
    r = run_bench("--dry-run", "--skip-mla", str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert [line.split(":")[0] for line in r.stdout.splitlines()] == ["indexer", "entries", "dsv4"], r.stdout
    assert json.loads((tmp_path / "dry_run.json").read_text()).keys() == {
        "workloads", "quant_workloads", "engine_entry_workloads", "dsv4_workloads"}
    bad = run_bench("--dry-run", "--families", "nope")
    assert bad.returncode != 0 and "no family ['nope']" in bad.stderr, bad.stderr


def test_the_record_round_trips_and_renders_the_readme_tables(bench, tmp_path):
    import record
    written = record.write(tmp_path, RECORD, bench.FAMILIES)
    assert written[:2] == ["bench.json", "bench.md"]
    assert json.loads((tmp_path / "bench.json").read_text()) == RECORD
    md = (tmp_path / "bench.md").read_text().splitlines()
    readme = Path(BENCH, "README.md").read_text().splitlines()
    tables, table = [], []
    for line in readme + [""]:
        if line.startswith("|"):
            table.append(line)
        elif table:
            tables.append(table)
            table = []
    shown = [t for t in tables if not t[0].startswith("| target |")]
    assert len(shown) >= 5  # the gather, the write, the two MLA tables, the host costs
    for t in shown:  # each table README shows is the record's, line for line
        at = md.index(t[0])
        assert md[at:at + len(t)] == t, t[0]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_no_module_of_benchmarks_imports_another_in_a_circle(bench):
    files = {p.stem: p for p in Path(BENCH).glob("*.py")}
    files.update({p.stem: p for p in Path(BENCH, "experiments").glob("*.py")})
    graph = {m: _imports(p) & files.keys() for m, p in files.items()}
    state = {}

    def visit(m, path):
        state[m] = "open"
        for n in graph[m]:
            assert state.get(n) != "open", f"import circle: {' -> '.join(path + [n])}"
            if n not in state:
                visit(n, path + [n])
        state[m] = "done"
    for m in graph:
        if m not in state:
            visit(m, [m])
    families = {f.__name__ for f in bench.FAMILIES}
    for m in families:
        assert not graph[m] & (families | {"bench"}), (m, graph[m])  # a family imports shared modules only
    for m in ("timing", "paged_batch", "record", "baselines"):
        assert not graph[m] & (families | {"bench"}), (m, graph[m])
