"""benchmarks/chunked.py without a GPU (issue 27): its dry run plans every row (the op's full
checks on each workload, byte counts, the baseline's grid) and compiles the vLLM-style baseline
for sm_90 with NVRTC (the baseline itself on the host emulator: test_baselines.py)."""
import pytest


@pytest.fixture(scope="module")
def chunked(bench):
    import chunked
    return chunked


def test_dry_run_plans_every_row_and_compiles_the_baseline(chunked):
    plans = chunked.dry_run()["chunked_gather_workloads"]  # raises on a refused plan, a byte count or grid that is off, no cubin
    # issue 27's nine workloads x (cp_gather fp8, dequant auto bf16, dequant fp8 -> bf16) x seq_starts off/on
    assert {p["workload"] for p in plans} == {"1x65536", "1x131072", "8x16384", "64x2048", "256x1000", "1024x256",
                                              "4096x64", "1x1000", "8x100"}
    assert len(plans) == 54 and len({(p["workload"], p["variant"], p["seq_starts"]) for p in plans}) == 54
    per_token = {"cp_gather fp8": (1152, "copy"), "dequant auto bf16": (2304, "copy"),
                 "dequant fp8->bf16": (1728, "e4m3_bf16")}  # bytes read + written per token
    for p in plans:
        assert (p["bytes"], p["conversion"]) == (p["tokens"] * per_token[p["variant"]][0], per_token[p["variant"]][1])
        assert p["tasks"] <= p["baseline_grid"], p
    # with seq_starts the pages are partial at both ends: more tasks than without
    tasks = {(p["workload"], p["variant"], p["seq_starts"]): p["tasks"] for p in plans}
    assert tasks["4096x64", "cp_gather fp8", True] > tasks["4096x64", "cp_gather fp8", False]


def test_dry_run_from_the_command_line(run_bench):
    r = run_bench("--dry-run", "--families", "chunked")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.startswith("chunked: 54 chunked_gather_workloads planned, baselines compiled for sm_90"), \
        r.stdout[:500]


def test_a_row_prints_and_lands_in_the_record_tables(chunked):
    """The row the record holds (chunked_gather_workloads) and the line printed for it, from
    made-up timings: the ratios, the targets (1.1x the copy from 64K tokens, 1.3x below, faster
    than the baseline) and the markdown table."""
    import timing

    def row(tokens, op, copy, base):
        r = {"workload": "1x65536", "variant": "cp_gather fp8", "seq_starts": True, "requests": 1, "tokens": tokens,
             "bytes": tokens * 1152, "op_us": op, "copy_us": copy, "baseline_us": base,
             "op_spread_us": [op - 1, op + 1], "baseline_spread_us": [base - 1, base + 1]}
        return chunked.targets(timing.ratios(r))
    fast, slow_small, beaten = row(65536, 33.0, 30.0, 40.0), row(1000, 6.6, 5.0, 9.0), row(65536, 31.0, 30.0, 30.5)
    assert fast["target_over_copy"] == 1.1 and fast["meets_targets"]
    assert slow_small["target_over_copy"] == 1.3 and not slow_small["meets_targets"]  # 1.32x the copy
    assert not beaten["meets_targets"]  # within 1.1x, but the baseline is faster
    met = [t for t, _ in chunked.TABLE.columns].index("met")
    assert chunked.TABLE.line(fast).split(" | ")[met] == "yes"
    assert chunked.TABLE.line(slow_small).split(" | ")[met] == "no"
    md = chunked.markdown({"chunked_gather_workloads": [fast, slow_small]})
    assert md[1].startswith("| chunked gather (requests x context) | variant | seq_starts |") and len(md) == 5
    assert md[3] == "| 1x65536 | cp_gather fp8 | yes | 65536 | 75.5 | 30.0 | 33.0 | 1.10 | 40.0 | 1.33 | 1.1 | yes | " \
                    "32.0-34.0 |", md[3]
