"""The order ptxas gives a small call's loads, read in the sm_90 SASS of NVRTC's cubin (NVIDIA's
nvdisasm, from the nvidia-cuda-nvdisasm wheel of the test extra; no GPU).

A small call's time is its chain of dependent DRAM round trips. In the warp-a-row entries of the
indexer gather and the index-K read, a row's value vector and its scale word are loaded in one
round trip: both loads issue before either store. ptxas may move an .nc load below a store (it
did: the index-K read's scale load came after the value store, a second round trip), so the scale
word is loaded with ng_ld_ordered (a coherent ld.global, the only one in these entries), and this
checks its place: after the row's request and page are found (the last warp shuffle or vote)
and before any store of copied data."""
import dataclasses
import re
import shutil
import subprocess

import pytest

from helpers.nvidia_files import nvidia_file
from nvrtc_gather.jit import compiler
from nvrtc_gather.kernels import dsv4_gather, gather, index_k_read, indexer_k_scatter

WARP_ROW_ENTRIES = [(m, e) for m in (*gather.MODULES.values(), *index_k_read.MODULES.values())
                    for e in m.kernels if e.endswith("_tiny")]
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_ERROR_SLOT = re.compile(r"\+0x(8|10|18)\]")  # ng_report's stores: err[1..3], after its atomic


def nvdisasm() -> str | None:
    found = nvidia_file("*/bin/nvdisasm")
    return str(found) if found else shutil.which("nvdisasm")


@pytest.fixture(scope="module")
def sass(tmp_path_factory):
    tool = nvdisasm()
    if tool is None:
        pytest.skip("nvdisasm not installed (pip install nvidia-cuda-nvdisasm: the test extra has it)")
    texts = {}

    def of(module) -> dict[str, list[tuple[str, str]]]:
        if module.name not in texts:
            cubin = tmp_path_factory.mktemp("sass") / f"{module.name}.cubin"
            cubin.write_bytes(compiler.compile_module(module, compiler.Target("sm_90")).image)
            out = subprocess.run([tool, str(cubin)], capture_output=True, check=True, text=True).stdout
            entries, current = {}, None
            for line in out.splitlines():
                if line.startswith(".text."):
                    current = entries.setdefault(line[len(".text."):].rstrip(":"), [])
                elif current is not None and (m := _INSTRUCTION.search(line)):
                    current.append((m.group(1), m.group(2)))
            texts[module.name] = entries
        return texts[module.name]
    return of


_VALUE_LOAD = {16: ("LDG.E.128.CONSTANT", "STG.E.128"), 8: ("LDG.E.64.CONSTANT", "STG.E.64"),
               4: ("LDG.E.CONSTANT", "STG.E")}


def round_trip_problem(code: list[tuple[str, str]], vec: int) -> str | None:
    """What puts a second round trip into a warp-a-row entry's copy, or None."""
    ordered = [i for i, (op, _) in enumerate(code) if op == "LDG.E"]
    if len(ordered) != 1:
        return f"expected one coherent scale load (ng_ld_ordered), found {len(ordered)}"
    at = ordered[0]
    search_end = max(i for i, (op, _) in enumerate(code[:at]) if op.startswith(("SHFL", "VOTE")))
    early = [f"{op} {args}" for op, args in code[search_end:at]
             if op.startswith("STG") and not args.endswith(", RZ") and not _ERROR_SLOT.search(args)]
    if early:
        return f"stores before the row's scale load (a second round trip): {early}"
    load, store = _VALUE_LOAD[vec]
    first_store = next((i for i in range(at, len(code)) if code[i][0] == store and not code[i][1].endswith(", RZ")),
                       None)
    if first_store is None:
        return f"no {store} (the row's value store) after it"
    if not any(op == load for op, _ in code[search_end:first_store]):
        return f"no {load} (the row's value vector) before the value store"
    return None


@pytest.mark.parametrize("module, entry", WARP_ROW_ENTRIES, ids=[e for _, e in WARP_ROW_ENTRIES])
def test_a_rows_scale_load_issues_before_its_value_store(sass, module, entry):
    vec = int(re.search(r"_v(\d+)", entry).group(1))
    assert round_trip_problem(sass(module)[entry], vec) is None, entry


def test_the_check_finds_a_value_store_issued_before_the_scale_load(sass, monkeypatch):
    """The copy with its scale load written after the value store: the check reports it (it is
    not a check that passes on any code)."""
    from nvrtc_gather.jit import sources
    real = sources.read_source
    before = "    if (has_s) sw = ng_ld_ordered(ssrc + lane);\n    if (has_v) dst[lane] = v;\n"
    after = "    if (has_v) dst[lane] = v;\n    if (has_s) sw = ng_ld_ordered(ssrc + lane);\n"
    assert before in real("tile_copy.cuh")
    monkeypatch.setattr(sources, "read_source", lambda n: real(n).replace(before, after))
    module = index_k_read.MODULES[16, "i32", "i32"]
    code = sass(dataclasses.replace(module, name=module.name + "_store_first"))
    problem = round_trip_problem(code[index_k_read.entry_name(16, "i32", "i32", "tiny")], 16)
    assert problem is not None and problem.startswith("stores before the row's scale load"), problem


READ_ENTRIES = [(m, e) for m in index_k_read.MODULES.values() for e in m.kernels]
_REGISTER = re.compile(r"\bR(\d+)\b")


def loads_before_first_wait(code: list[tuple[str, str]], k: int = 0, after: int | None = None) -> int:
    """How many index loads issue after the entry's load number ``after`` (default ``k``; 0: the
    first, the lengths') and before any instruction reads the register that load ``k`` wrote: the
    warp waits there for that DRAM round trip."""
    loads = [i for i, (op, _) in enumerate(code) if op.startswith("LDG.E") and op.endswith("CONSTANT")]
    op, args = code[loads[k]]
    first = int(_REGISTER.search(args).group(1))
    written = {first, first + 1} if ".64" in op else {first}
    wait = next(i for i in range(loads[k] + 1, len(code))
                if any(int(r) in written for r in _REGISTER.findall(code[i][1].split(",", 1)[-1])))
    return sum(loads[k if after is None else after] < i < wait for i in loads)


@pytest.mark.parametrize("module, entry", READ_ENTRIES, ids=[e for _, e in READ_ENTRIES])
def test_the_reads_first_lengths_and_page_ids_share_one_round_trip(sass, module, entry):
    """The index-K read's first lengths and its guessed page ids (the window, or one request's
    row's id; request-major: the request's own length and its row's id) are loaded before anything
    waits for either: a conversion right after the page id load (an int32 id sign-extended to 64
    bits) once held the lengths' load back by a DRAM round trip."""
    # the window's load, and in the block-a-tile entries also one request's guessed id
    assert loads_before_first_wait(sass(module)[entry]) >= (1 if entry.endswith("_tiny") else 2), entry


SCATTER_ENTRIES = [(m, e) for m in indexer_k_scatter.MODULES.values() for e in m.kernels]


@pytest.mark.parametrize("module, entry", SCATTER_ENTRIES, ids=[e for _, e in SCATTER_ENTRIES])
def test_a_writes_slot_and_its_bytes_share_one_round_trip(sass, module, entry):
    """The write (SGLang's SetKAndS, indexer_k_scatter): a unit's slot and its bytes (a value
    vector or a scale word, which do not depend on the slot) are loaded before anything waits for
    the slot, so a small write is one DRAM round trip before its store; loaded after the slot's
    checks, as they were, they were two."""
    assert loads_before_first_wait(sass(module)[entry]) >= 1, entry


# The 16-byte entries (an aligned buffer and outputs: what torch and SGLang allocate). In the 8- and
# 4-byte entries ptxas interleaves the pass's loads with their sums (6 loads a round trip, sm_90).
SKIP_ENTRIES = [(m, e) for m, e in READ_ENTRIES
                if e.startswith("index_k_read_v16") and not e.endswith(("_tiny", "_req", "_req_wide"))]
# The row-major entry SGLang 0.5.23's read reaches (int64 lengths, int32 page table; every layout:
# that shape has no constant-size build, kernels/index_k_read.py FIXED_SHAPES): one round trip with
# every NVRTC measured. NVRTC 13.0's ptxas splits the other entries' passes (12, 14, 5 or 2 of the 16
# loads before the first use; NOTES.md v22); 13.5's keeps all 16 together in every 16-byte entry.
SGLANG_ENTRIES = ("index_k_read_v16_l64_p32",)


@pytest.mark.parametrize("module, entry", SKIP_ENTRIES, ids=[e for _, e in SKIP_ENTRIES])
def test_the_reads_skip_pass_loads_its_lengths_in_one_round_trip(sass, module, entry):
    """The index-K read's skip pass (skip_chunks: a block far into a large batch sums 16 chunks of
    lengths at once) issues its 16 32-bit length loads before it uses any: one round trip a pass.
    With 64-bit or predicated loads ptxas used each value right after its load, a round trip a
    load. The pass's loads are the 16 before its first butterfly shuffle (its warp sums)."""
    if entry not in SGLANG_ENTRIES and compiler.nvrtc_version() < (13, 5):
        pytest.skip(f"NVRTC {compiler.nvrtc_version()}: its ptxas splits this entry's pass (measured with 13.0)")
    code = sass(module)[entry]
    bfly = next(i for i, (op, _) in enumerate(code) if op.startswith("SHFL.BFLY"))
    loads = [i for i, (op, _) in enumerate(code) if op.startswith("LDG.E") and op.endswith("CONSTANT")]
    first = [i for i in loads if i < bfly][-16]
    assert all(code[i][0] == "LDG.E.CONSTANT" for i in loads if first <= i < bfly), entry  # 32-bit words
    assert loads_before_first_wait(code, loads.index(first)) >= 15, entry


def spills(code: list[tuple[str, str]]) -> list[str]:
    """The entry's local-memory stores and loads: the read keeps nothing in local memory, so each
    is a register spilled and refilled."""
    return [f"{op} {args}" for op, args in code if op.startswith(("STL", "LDL"))]


CONSTANT_SIZE_ENTRIES = [(m, e) for m, e in READ_ENTRIES if index_k_read.FIXED_TAG in e]


@pytest.mark.parametrize("module, entry", CONSTANT_SIZE_ENTRIES, ids=[e for _, e in CONSTANT_SIZE_ENTRIES])
def test_the_reads_constant_size_entries_spill_nothing(sass, module, entry):
    """A constant-size build (kernels/index_k_read.py FIXED_SHAPES) is there to run less code; the
    request-major one spilled within RESIDENT's registers (a local load a tile, before its copy) and
    measured slower there: it is bounded at FIXED_RESIDENT."""
    assert spills(sass(module)[entry]) == [], entry


def test_the_request_major_constant_size_build_spills_at_the_general_entrys_bound(sass):
    """The constant-size request-major entry is bounded at FIXED_RESIDENT blocks an SM; built at
    the general entry's RESIDENT it spills, and the check sees it (it is not a check that passes on
    any code). Should a ptxas stop spilling it there, measure it (benchmarks/experiments/code_ab.py)
    before its bound changes."""
    module = index_k_read.MODULES[16, "i64", "i32"]
    (req,) = [e for e in module.entries if e.name.endswith(index_k_read.FIXED_TAG + "_req")]
    assert req.body.endswith(", true>") and req.min_blocks == index_k_read.FIXED_RESIDENT
    tight = dataclasses.replace(req, name=req.name + "_resident", min_blocks=index_k_read.RESIDENT)
    code = sass(dataclasses.replace(module, name=module.name + "_req_resident", entries=(tight,)))
    assert spills(code[tight.name]), tight.name


def test_vllms_form_loads_a_rows_block_id_beside_the_lengths(sass):
    """vLLM's DeepSeek-V4 form without gather_lens (its compressed-cache call): a row's position is
    its index, so its block id is loaded before anything waits for the request's length (its
    first two loads are seq_lens and gather_lens, in either order; the third the block id), and
    the record is two DRAM round trips from the start instead of three."""
    code = sass(dsv4_gather.PAGED_MODULE)[dsv4_gather.PAGED_ENTRY]
    assert max(loads_before_first_wait(code, k, after=1) for k in (0, 1)) >= 1
