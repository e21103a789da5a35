"""Extreme and random index values through the public ops on a GPU: the cases of
tests/emulator/test_index_fuzz_emulated.py (same kinds, same checks: helpers/index_fuzz.py), each
laid out in one device buffer whose bytes outside the op's tensors hold a guard pattern, run
by cp_gather_indexer_k_quant_cache (every entry point: its shape forced through the op's
``prepared(tokens_per_cta=)`` hook, which launches as the op does) and
indexer_k_quant_and_cache (every entry point, through the public op), with
NVRTC_GATHER_DEBUG unset and set. Afterwards the whole buffer must be what the reference
says: rows with good indices bit-exact, rows with bad ones and every guard byte untouched.
In debug mode an op must raise ValueError exactly when an index is bad. Meant to run under
compute-sanitizer memcheck too (scripts/gpu_check.sh), which sees stray accesses past the
buffer."""
import pytest
import torch

import nvrtc_gather as ng
from helpers.index_fuzz import (DTYPES, GATHER_ENTRIES, GATHER_KINDS, QUANT_ENTRIES, QUANT_IDS, QUANT_KINDS,
                                check_gather, check_quant, gather_case, gather_is_bad, quant_case)
from nvrtc_gather.ops import gather, indexer_k_quant
from nvrtc_gather.kernels import gather as gather_kernels, indexer_k_quant as quant_kernels

pytestmark = pytest.mark.gpu


def _on_device(case):
    """The case's buffer on the GPU, and the op's tensors as the same views of it."""
    dev = case.arena.bytes.to("cuda")

    def same(t):
        u = t.view(torch.uint8)
        return dev.as_strided(u.shape, u.stride(), u.storage_offset()).view(t.dtype)
    return dev, tuple(same(t) for t in case.tensors)


def _debug(monkeypatch, debug):
    if debug:
        monkeypatch.setenv("NVRTC_GATHER_DEBUG", "1")
    else:
        monkeypatch.delenv("NVRTC_GATHER_DEBUG", raising=False)


def _call(op, args, expect_error, desc):
    """Run the op; in debug mode with a bad index it must raise ValueError, else nothing."""
    if expect_error:
        with pytest.raises(ValueError, match="debug mode"):
            op(*args)
    else:
        try:
            op(*args)
        except ValueError as exc:
            pytest.fail(f"raised {exc!r}: {desc}")
    torch.cuda.synchronize()


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("vec,shape", GATHER_ENTRIES, ids=[gather_kernels.entry_name(*e) for e in GATHER_ENTRIES])
def test_gather_extreme_indices(vec, shape, debug, monkeypatch):
    _debug(monkeypatch, debug)
    entry = gather_kernels.entry_name(vec, shape)
    for kind in GATHER_KINDS:
        c = gather_case(f"gpu-gather-v{vec}{shape}-{kind}", kind, vec, shape)
        c.plan = gather.plan_gather(*c.tensors)._replace(tokens_per_cta=c.tpc)  # the CPU plan: block_stride
        c.desc = c.describe(entry, debug)
        c.before = c.arena.bytes.clone()
        dev, args = _on_device(c)
        assert gather.launch_config(gather.plan_gather(*args)._replace(tokens_per_cta=c.tpc)).entry == entry, c.desc
        _call(gather.prepared(*args, tokens_per_cta=c.tpc), (), debug and gather_is_bad(c), c.desc)
        c.arena.bytes.copy_(dev.cpu())
        check_gather(c, False, (0, 0, 0))  # (the op's own error buffer, not the case's, in debug mode)


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("dt,vec,shape", QUANT_ENTRIES, ids=QUANT_IDS)
def test_quant_extreme_slots(dt, vec, shape, debug, monkeypatch):
    _debug(monkeypatch, debug)
    entry = quant_kernels.entry_name(dt, vec, shape)
    for kind in QUANT_KINDS:
        if kind.startswith("alias"):  # needs a cache the op's checks refuse (stride 0): emulator only
            continue
        c = quant_case(f"gpu-quant-{dt}-v{vec}{'-' + shape if shape else ''}-{kind}", kind, dt, vec, shape)
        c.desc = c.describe(entry, debug)
        c.before = c.arena.bytes.clone()
        dev, (k, kv, sm) = _on_device(c)
        plan = indexer_k_quant.plan_quant(k, kv, sm, c.qbs, c.scale_fmt)
        assert indexer_k_quant.launch_config(plan, shape).entry == entry, c.desc
        bad = any(s >= c.num_slots for s in c.slots)
        _call(indexer_k_quant.prepared(k, kv, sm, c.qbs, c.scale_fmt, shape=shape), (), debug and bad, c.desc)
        c.arena.bytes.copy_(dev.cpu())
        check_quant(c, False, (0, 0, 0))
