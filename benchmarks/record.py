"""The record of one run: ``bench.json`` (the environment, each family's sections, the host
costs), ``bench.md`` (each family's tables, the host-cost table) and ``bench.png`` (the
indexer gather's chart, with matplotlib). benchmarks/record.json is one such ``bench.json``.
Families describe their tables as ``Table`` objects and print their rows with them as they go."""
from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path


class Table:
    """One markdown table: ``columns`` is a list of (title, cell) where cell(row) -> str."""

    def __init__(self, section: str, columns: list):
        self.section, self.columns = section, columns

    def header(self) -> list[str]:
        return ["| " + " | ".join(t for t, _ in self.columns) + " |", "|" + " --- |" * len(self.columns)]

    def line(self, row: dict) -> str:
        return "| " + " | ".join(cell(row) for _, cell in self.columns) + " |"

    def lines(self, record: dict) -> list[str]:
        rows = record.get(self.section) or []
        return ["", *self.header(), *map(self.line, rows)] if rows else []


# cells of the usual columns
def num(key: str, fmt: str = ".1f"):
    return lambda r: format(r[key], fmt) if key in r else "-"


def spread(name: str):
    return lambda r: "{:.1f}-{:.1f}".format(*r[f"{name}_spread_us"]) if f"{name}_spread_us" in r else "-"


def mb(r: dict) -> str:
    return f"{r['bytes'] / 1e6:.1f}"


def environment() -> dict:
    import torch
    from nvrtc_gather.jit import compiler, driver
    return {"gpu": torch.cuda.get_device_name(0), "driver_cuda": driver.driver_version(), "torch": torch.__version__,
            "nvrtc": "%d.%d" % compiler.nvrtc_version(), "python": platform.python_version(),
            "date": datetime.date.today().isoformat()}


def host_lines(host: dict) -> list[str]:
    out = ["", "| host cost per call (median of 10,000) | µs | / torch copy_ |", "| --- | --- | --- |"]
    return out + [f"| {k[:-3].replace('_', ' ')} | {v:.2f} | {host.get(k[:-3] + '_over_copy', '')} |"
                  for k, v in host.items() if k.endswith("_us")]


def markdown(record: dict, families) -> str:
    """The tables of benchmarks/README.md, from one run's record."""
    env = record["environment"]
    out = [f"{env['gpu']}, CUDA driver {env['driver_cuda']}, torch {env['torch']}, NVRTC {env['nvrtc']}, "
           f"Python {env['python']}, {env['date']}. Median µs, L2 flushed before each run."]
    for fam in families:
        out += fam.markdown(record)
    if record.get("host_cost"):
        out += host_lines(record["host_cost"])
    return "\n".join(out) + "\n"


def write(out: Path, record: dict, families) -> list[str]:
    """bench.json, bench.md and (with matplotlib) bench.png in ``out``; the names written."""
    (out / "bench.json").write_text(json.dumps(record, indent=2))
    (out / "bench.md").write_text(markdown(record, families))
    return ["bench.json", "bench.md"] + (["bench.png"] if chart(record, out / "bench.png") else [])


def chart(record: dict, path: Path) -> bool:
    """The indexer gather's chart; False (nothing written) without its rows or matplotlib (the `bench` extra)."""
    rows = record.get("workloads")
    try:
        import matplotlib
    except ImportError:
        return False
    if not rows:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    series = [("copy", "copy_us"), ("op", "op_us"), ("linear scan", "baseline_us"), ("torch", "torch_us")]
    fig, ax = plt.subplots(figsize=(11, 5))
    for i, (label, key) in enumerate(series):
        ax.bar([x + (i - 1.5) * 0.2 for x in range(len(rows))], [r[key] for r in rows], 0.2, label=label)
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)), [r["workload"] for r in rows], rotation=20)
    ax.set_ylabel("µs (median, L2 flushed)")
    ax.set_title(f"cp_gather_indexer_k_quant_cache on {record['environment']['gpu']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True
