"""Index fuzzing of both kernels on the host emulator (tests/helpers/cuda_host_emu.cpp): random and
extreme int32 values of cu_seq_lens and block_table, int64 values of slot_mapping, through
every entry point of cuda_src/gather_indexer_k.cu, cuda_src/quant_cache.cu, the MLA kernels and
cuda_src/cache_gather.cu, with and without the debug error buffer.

The contract (docs/contract.md §3): for every index value the kernels read and write only
the tensors they are given; a row with bad indices is skipped (and reported in debug mode),
every other row is written bit-exactly. Every buffer of a case lives in one shared anonymous
mapping whose other bytes hold a guard pattern (GUARD bytes at least on each side), and the
whole mapping is compared with what the reference says afterwards; the emulator counts each
__ldg outside the buffers the kernel may read (and reads zeros there); a test's launches run in
a forked child (emu_launch_isolated), so a stray access that faults fails the case it happened
in instead of killing pytest. Each case has its own seed; a failure prints the case's values.
Skipped without a C++20 compiler or fork()."""
import pytest
import torch

from helpers.host_emu import emulator
from helpers.index_fuzz import (CACHE_GATHER_ENTRIES, CACHE_GATHER_IDS, CACHE_GATHER_KINDS, CACHE_GATHER_REPEATS,
                                Launch, cache_gather_case, cache_gather_launch, check_cache_gather, GATHER_ENTRIES, GATHER_KINDS, GATHER_REPEATS, MLA_GATHER_ENTRIES, MLA_GATHER_KINDS,
                                MLA_GATHER_REPEATS, MLA_WRITE_ENTRIES, MLA_WRITE_IDS, MLA_WRITE_KINDS,
                                MLA_WRITE_REPEATS, QUANT_ENTRIES, QUANT_IDS, QUANT_KINDS, QUANT_REPEATS,
                                check_gather, check_mla_gather, check_mla_write, check_quant, gather_case,
                                gather_launch, launch_problem, mla_gather_case, mla_gather_launch, mla_write_case,
                                mla_write_launch, pack, quant_case, quant_launch, run_isolated)
from nvrtc_gather.ops import gather
from nvrtc_gather.kernels import gather as gather_kernels

@pytest.fixture(scope="module")
def gather_emu(tmp_path_factory):
    return emulator(tmp_path_factory, kernel="gather")


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("vec,shape", GATHER_ENTRIES, ids=[gather_kernels.entry_name(*e) for e in GATHER_ENTRIES])
def test_gather_index_fuzz(gather_emu, vec, shape, debug):
    cases = [gather_case(f"gather-v{vec}{shape}-{kind}-{rep}", kind, vec, shape)
             for rep in range(GATHER_REPEATS) for kind in GATHER_KINDS]
    outcomes = run_isolated(gather_emu, [gather_launch(c, vec, shape, debug) for c in cases])
    for c, outcome in zip(cases, outcomes):
        check_gather(c, debug, outcome)


MXFP4_ENTRIES = [(vec, shape) for vec, shape in GATHER_ENTRIES if shape != "wide"]  # wide needs rows > 16 KiB / 64 B


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("vec,shape", MXFP4_ENTRIES, ids=[gather_kernels.entry_name(*e) for e in MXFP4_ENTRIES])
def test_gather_index_fuzz_on_vllms_mxfp4_cache(gather_emu, vec, shape, debug):
    """The same hostile indices on vLLM's MXFP4 indexer cache layout (68-byte tokens, not a multiple of 16)."""
    cases = [gather_case(f"gather-mxfp4-v{vec}{shape}-{kind}-{rep}", kind, vec, shape, mxfp4=True)
             for rep in range(GATHER_REPEATS) for kind in GATHER_KINDS]
    outcomes = run_isolated(gather_emu, [gather_launch(c, vec, shape, debug) for c in cases])
    for c, outcome in zip(cases, outcomes):
        check_gather(c, debug, outcome)


def test_a_fault_is_a_clean_failure(gather_emu):
    """The harness itself: of three launches, the second's dst_k points at unmapped memory: its
    child dies, the first is checked, the failure names the second, pytest lives on."""
    cases = [gather_case(f"harness-{i}", "valid", 16, "") for i in range(3)]
    launches = [gather_launch(c, 16, "", False) for c in cases]
    cases[1].plan = cases[1].plan._replace(k_ptr=4096)
    c = cases[1]
    c.tensors[4].copy_(torch.arange(len(c.cu), dtype=torch.int32))  # a row per request: a store happens
    c.tensors[3].zero_()
    name, grid, fields = gather.launch_config(c.plan)
    launches[1] = Launch(name, grid, pack(gather_kernels.PARAMS, fields, 0), [])
    outcomes = run_isolated(gather_emu, launches)
    check_gather(cases[0], False, outcomes[0])
    assert outcomes[1][0] < 0 and "signal" in launch_problem(*outcomes[1])
    assert launch_problem(*outcomes[2]).startswith("the launch did not run")


def test_a_launch_past_the_limit_is_a_hang(gather_emu):
    """The harness's hang limit (each launch's own): at 0 ms a launch of 256 emulated threads
    outlasts it; that launch is the hung one and none after it runs."""
    cases = [gather_case(f"hang-{i}", "valid", 16, "") for i in range(3)]
    outcomes = run_isolated(gather_emu, [gather_launch(c, 16, "", False) for c in cases], timeout_ms=0)
    problems = [launch_problem(*o) for o in outcomes]
    hung = [i for i, p in enumerate(problems) if p and p.startswith("the launch hung")]
    assert len(hung) == 1, problems
    assert all(p is None for p in problems[:hung[0]]), problems
    assert all(p.startswith("the launch did not run") for p in problems[hung[0] + 1:]), problems


@pytest.fixture(scope="module")
def quant_emu(tmp_path_factory):
    return emulator(tmp_path_factory, kernel="quant")


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("dt,vec,shape", QUANT_ENTRIES, ids=QUANT_IDS)
def test_quant_slot_fuzz(quant_emu, dt, vec, shape, debug):
    cases = [quant_case(f"quant-{dt}-v{vec}{'-' + shape if shape else ''}-{kind}-{rep}", kind, dt, vec, shape)
             for rep in range(QUANT_REPEATS) for kind in QUANT_KINDS]
    outcomes = run_isolated(quant_emu, [quant_launch(c, dt, vec, debug, shape) for c in cases])
    for c, outcome in zip(cases, outcomes):
        check_quant(c, debug, outcome)


# --- the MLA kernels --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mla_gather_emu(tmp_path_factory):
    return emulator(tmp_path_factory, kernel="mla_gather")


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("vec", MLA_GATHER_ENTRIES, ids=["v16", "v4"])
def test_mla_gather_index_fuzz(mla_gather_emu, vec, debug):
    """Any int32 in workspace_starts, seq_starts and block_table (negative, huge, decreasing):
    only the given tensors are read, a row is written only with a reading its indices allow
    (exactly it, for well-formed starts), nothing else in the arena changes; debug mode reports
    exactly when something is bad."""
    cases = [mla_gather_case(f"mla-gather-v{vec}-{kind}-{rep}", kind, vec)
             for rep in range(MLA_GATHER_REPEATS) for kind in MLA_GATHER_KINDS]
    outcomes = run_isolated(mla_gather_emu, [mla_gather_launch(c, vec, debug) for c in cases])
    for c, outcome in zip(cases, outcomes):
        check_mla_gather(c, debug, outcome)


@pytest.fixture(scope="module")
def mla_write_emu(tmp_path_factory):
    return emulator(tmp_path_factory, kernel="mla_write")


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("fmt,dt,vec", MLA_WRITE_ENTRIES, ids=MLA_WRITE_IDS)
def test_mla_write_slot_fuzz(mla_write_emu, fmt, dt, vec, debug):
    """Any int64 slot: only kv_c / k_pe / slot_mapping / scale are read, only the well-formed
    slots' entries are written (bit-exact with the reference), debug mode reports a slot past
    the cache."""
    cases = [mla_write_case(f"mla-write-{fmt}-{dt}-v{vec}-{kind}-{rep}", kind, fmt, dt, vec)
             for rep in range(MLA_WRITE_REPEATS) for kind in MLA_WRITE_KINDS]
    outcomes = run_isolated(mla_write_emu, [mla_write_launch(c, fmt, dt, vec, debug) for c in cases])
    for c, outcome in zip(cases, outcomes):
        check_mla_write(c, debug, outcome)


# --- the chunked-context gathers --------------------------------------------------------------

@pytest.fixture(scope="module")
def cache_gather_emu(tmp_path_factory):
    return emulator(tmp_path_factory, kernel="cache_gather")


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("conversion,widths,tiny", CACHE_GATHER_ENTRIES, ids=CACHE_GATHER_IDS)
def test_cache_gather_index_fuzz(cache_gather_emu, conversion, widths, tiny, debug):
    """Any int32 in cu_seq_lens, seq_starts and block_table (negative, huge, decreasing): only
    the given tensors are read (the scale only by the dequantizing entry points), a row is
    written only with a reading its indices allow (exactly it, for well-formed cu_seq_lens),
    nothing else in the arena changes; debug mode reports exactly when something is bad."""
    cases = [cache_gather_case(f"cache-gather-{conversion}-{widths}-{kind}-{rep}", kind, conversion, widths)
             for rep in range(CACHE_GATHER_REPEATS) for kind in CACHE_GATHER_KINDS]
    outcomes = run_isolated(cache_gather_emu, [cache_gather_launch(c, widths, debug, tiny) for c in cases])
    for c, outcome in zip(cases, outcomes):
        check_cache_gather(c, debug, outcome)
