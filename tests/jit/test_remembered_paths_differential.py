"""The remembered paths of every op (each registered op, from tests/helpers/op_calls.py's valid
calls) and of SGLang's entries (the index-K read and write and their hooks, DeepSeek-V4's flat forms and
their hook) accept exactly what their full checks accept and launch exactly what those would: CPU tensors
planned as cuda:0, on a fake driver that records each launch (kernel, grid, block, the parameter
struct field by field), no GPU.

Every call is made twice: with the memos empty (the full checks alone), and right after a valid
call of the base layout (so a call with the same metadata takes the remembered path). Both must
raise the same error, or launch the same kernels with the same grids and parameters (pointers of
fresh outputs aside: those are named by the output they belong to) and return outputs of the same
shapes, strides and dtypes. The calls are the base with one or two changes drawn from each
entry's list: other pointers under the same metadata, other host ints (bad ones included), other
strides, dtypes and shapes, tensors whose bytes are not their values (negative views only where
the remembered paths read the bit, the float scales: docs/contract.md, an integer tensor's
``torch._neg_view`` is refused on the first call of its metadata only). The last two tests
remember a changed call and change it again."""
import ctypes
import random
import types

import numpy as np
import pytest
import torch

from helpers import hostile_tensors, op_calls
from nvrtc_gather.integrations import sglang as sg
from nvrtc_gather.integrations import sglang_dsv4
from nvrtc_gather.jit import driver, runtime, spec
from nvrtc_gather.ops import (cache_gather, checks, dsv4_gather, gather, index_k_read, indexer_k_quant,
                              indexer_k_scatter, mla_gather, mla_write)

I32, I64, U8 = torch.int32, torch.int64, torch.uint8
READ_PAGE, V4_PAGE = 64 * 132, 4 * 584  # bytes of a page: the index buffer's (64 tokens), V4's (4 tokens)


class Recorder:
    """The raw driver entry points the launcher calls: every launch succeeds and is recorded."""

    def __init__(self):
        self.kernels, self.launches = {}, []  # CUfunction -> (module, entry name)
        self.full_checks = 0  # calls of checks.tensor

    def ctx_get_current(self, ref):
        ref._obj.value = 7
        return 0

    def launch_ex(self, cfg, function, params, extra):
        module, name = self.kernels[function]
        c = driver.LaunchConfig.from_address(cfg)
        raw = ctypes.string_at(ctypes.c_void_p.from_address(params).value, module.params.layout.size)
        self.launches.append((module, name, c.gridDimX, c.blockDimX, module.params.layout.unpack(raw)))
        return 0


@pytest.fixture
def fake(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(driver, "raw", lambda: rec)
    monkeypatch.setattr(driver, "primary_context", lambda device: 7)
    monkeypatch.setattr(driver, "sm_count", lambda device: 132)
    monkeypatch.setattr(runtime, "current_stream", lambda device: 0)
    loaded = {}
    for module in spec.registered():
        functions = {}
        for name in module.kernels:
            functions[name] = len(rec.kernels) + 1
            rec.kernels[functions[name]] = (module, name)
        loaded[module.name, 0] = runtime.LoadedModule(module, 0, functions)
    monkeypatch.setattr(runtime, "_loaded", loaded)
    real_read, real_scatter = index_k_read.plan_read, indexer_k_scatter.plan_scatter
    real_cache = dsv4_gather._cache_layout
    monkeypatch.setattr(index_k_read, "plan_read", lambda *a: real_read(*a)._replace(device=0))
    monkeypatch.setattr(indexer_k_scatter, "plan_scatter", lambda *a: real_scatter(*a)._replace(device=0))

    def cache_on_device_0(cache, page_size, name, three_d, token_bytes):
        layout = real_cache(cache, page_size, name, three_d, token_bytes)
        image = dsv4_gather.spec.PARAMS.image(page_stride=layout.page_stride, num_slots=layout.num_pages * page_size,
                                              page_size=page_size, num_pages=layout.num_pages)
        return layout._replace(device=0, image=image)
    monkeypatch.setattr(dsv4_gather, "_cache_layout", cache_on_device_0)
    monkeypatch.setattr(sglang_dsv4, "_SERVED_DEVICE", "cpu")  # the V4 hook takes these calls as CUDA's
    for module, plan, fields in PLANS:  # the registered ops' plans (indexer_k_scatter's above)
        monkeypatch.setattr(module, plan, _on_device_0(getattr(module, plan), fields))
    for module, name in MEMOS:  # fresh memos, the process's own back after the test (they would
        monkeypatch.setattr(module, name, getattr(module, name).__class__())  # hold device-0 layouts)
    real_tensor = checks.tensor

    def counted(*args):  # the full checks' first step: a remembered call never takes it
        rec.full_checks += 1
        return real_tensor(*args)
    monkeypatch.setattr(checks, "tensor", counted)
    return rec


def _on_device_0(plan, fields):
    return lambda *args, **kwargs: plan(*args, **kwargs)._replace(device=0, **fields)


# (module, plan function, the fields a CPU plan leaves 0 that a GPU's sets from its SM count)
PLANS = ((cache_gather, "plan_gather", {"rows_per_cta": 8}), (gather, "plan_gather", {"tokens_per_cta": 8}),
         (indexer_k_quant, "plan_quant", {}), (mla_gather, "plan_gather", {"rows_per_cta": 8}),
         (mla_write, "plan_write", {}))
MEMOS = ((index_k_read, "_layouts"), (dsv4_gather, "_layouts"), (dsv4_gather, "_flat_ready"),
         (dsv4_gather, "_paged_calls"), (sg, "_set_layouts"),
         *((m, "_layouts") for m in (cache_gather, gather, indexer_k_quant, indexer_k_scatter, mla_gather, mla_write)))


def forget():
    for module, name in MEMOS:
        getattr(module, name).clear()


def outcome(rec, call) -> tuple:
    """What a call did: ("raise", type, message), ("left to SGLang", ...) or ("ran", launches,
    outputs), the launches' pointer fields that hold a returned output's address named by it."""
    rec.launches.clear()
    try:
        got = call()
    except Exception as e:  # noqa: BLE001  the error is the outcome
        return "raise", type(e).__name__, str(e)
    if isinstance(got, str):  # the hook gave the call to SGLang's own function
        return "left to SGLang", got, rec.launches
    outs = got if isinstance(got, tuple) else (got,) if isinstance(got, torch.Tensor) else ()
    fresh = {t.data_ptr(): f"output {i}" for i, t in enumerate(outs) if t.numel()}
    launches = []
    for module, name, grid, block, values in rec.launches:
        pointers = len(module.params.pointer_names)
        fields = [fresh.get(v, v) if i < pointers else v for i, v in enumerate(values)]
        launches.append((name, grid, block, dict(zip(module.params.names, fields))))
    return "ran", launches, [(tuple(t.shape), t.stride(), t.dtype) for t in outs]


def assert_remembered(rec, call, checked: bool = False) -> None:
    """``call`` (the base) launches, and a second run of it takes the remembered path (no full
    checks; ``checked``: an entry whose tensors are checked on every call), so a change of the
    same metadata meets that path, not the full checks again."""
    first = outcome(rec, call)
    assert first[0] == "ran" and first[1], first
    before = rec.full_checks
    assert outcome(rec, call) == first
    assert (rec.full_checks > before) == checked, "the base call is not remembered" if not checked else "remembered"


# The flat form with a given out (op_calls' call): only the cache's layout is remembered, the ids
# and out are checked on every call (SGLang's entries pass out=None: the remembered path).
EVERY_CALL_CHECKED = {"dsv4_gather_flat"}


def shifted(t: torch.Tensor, by: int) -> torch.Tensor:
    """``t``'s metadata and values at a data pointer ``by`` bytes further on (a multiple of its
    element size: torch makes no view of a dtype off its alignment)."""
    size = t.element_size()
    room = torch.zeros(t.untyped_storage().nbytes() + 64, dtype=U8)
    base = room[by:by + (room.numel() - by) // size * size].view(t.dtype)
    # as_strided's offset counts from the storage's start: base's own offset is the shift
    out = base.as_strided(t.shape, t.stride(), base.storage_offset() + t.storage_offset())
    assert out.data_ptr() - room.data_ptr() == by + t.storage_offset() * size
    out.copy_(t)
    return out


# -- the entries: a base call and its changes -------------------------------------------------------

def _read_base():
    gen = torch.Generator().manual_seed(0)
    buf = torch.randint(0, 256, (5, READ_PAGE), dtype=U8, generator=gen)
    return dict(buf=buf, lens=torch.tensor([10, 70, 0], dtype=I32),
                pt=torch.tensor([[3, 0], [1, 4], [2, 2]], dtype=I32), total=80, longest=70, ps=64, hd=128, qbs=128)


def _read_call(a):
    return lambda: sg.get_index_k_scale_buffer(a["buf"], a["lens"], a["pt"], a["total"], a["longest"],
                                               page_size=a["ps"], index_head_dim=a["hd"], quant_block_size=a["qbs"])


def _hook_call(a):
    pool = types.SimpleNamespace(page_size=a["ps"], index_page_size=a["ps"], index_head_dim=a["hd"],
                                 quant_block_size=a["qbs"])
    execute = sg._get_hook(lambda *args, **kwargs: "SGLang's own")
    return lambda: execute(None, pool, a["buf"], page_indices=a["pt"], seq_len_tensor=a["lens"], seq_len_sum=a["total"],
                           max_seq_len=a["longest"])


_SEQ_SUMS = [0, 79, 81, 87, -1, index_k_read.MAX_ROWS + 1, True, 80.0, np.int64(80), None]
READ_CHANGES = [
    *[(f"buf +{b} bytes", lambda a, b=b: a.update(buf=shifted(a["buf"], b))) for b in (1, 2, 4, 8, 16, 64)],
    ("buf padded pages", lambda a: a.update(buf=torch.zeros(5, READ_PAGE + 16, dtype=U8)[:, :READ_PAGE])),
    ("buf int8", lambda a: a.update(buf=a["buf"].view(torch.int8))),
    ("buf 3-D", lambda a: a.update(buf=a["buf"].view(5, 64, 132))),
    ("buf 2 pages", lambda a: a.update(buf=a["buf"][:2])),
    *[(f"seq_len_sum {v!r}", lambda a, v=v: a.update(total=v)) for v in _SEQ_SUMS],
    *[(f"max_seq_len {v!r}", lambda a, v=v: a.update(longest=v)) for v in (0, 128, 129, -1, True, 70.0)],
    ("lens int64", lambda a: a.update(lens=a["lens"].to(I64))),
    ("lens strided", lambda a: a.update(lens=a["lens"].repeat_interleave(2)[::2])),
    ("lens +4 bytes", lambda a: a.update(lens=shifted(a["lens"], 4))),
    ("lens 2 requests", lambda a: a.update(lens=a["lens"][:2])),
    ("lens bad values", lambda a: a.update(lens=torch.tensor([-5, 2**31 - 1, 9], dtype=I32))),
    ("lens sparse", lambda a: a.update(lens=a["lens"].to_sparse())),
    ("lens 0-d", lambda a: a.update(lens=a["lens"][0])),
    ("lens a list", lambda a: a.update(lens=a["lens"].tolist())),
    ("buf None", lambda a: a.update(buf=None)),
    ("pt nested", lambda a: a.update(pt=hostile_tensors.KINDS["nested"](a["pt"]))),
    ("pt column-major", lambda a: a.update(pt=a["pt"].t().contiguous().t())),
    ("pt int64", lambda a: a.update(pt=a["pt"].to(I64))),
    ("pt +8 bytes", lambda a: a.update(pt=shifted(a["pt"], 8))),
    ("pt rows expanded", lambda a: a.update(pt=a["pt"][:1].expand(3, 2))),
    ("pt 3 columns", lambda a: a.update(pt=torch.cat([a["pt"], a["pt"][:, :1]], 1))),
    ("pt bad ids", lambda a: a.update(pt=torch.tensor([[9, -1], [1, 4], [2, 2]], dtype=I32))),
    ("pt sparse", lambda a: a.update(pt=a["pt"].to_sparse())),
    ("page_size 64.0", lambda a: a.update(ps=64.0)),
    ("page_size True", lambda a: a.update(ps=True)),
    ("page_size 32", lambda a: a.update(ps=32)),
    ("index_head_dim 64", lambda a: a.update(hd=64)),
    ("quant_block_size 64", lambda a: a.update(qbs=64)),
    ("quant_block_size 128.0", lambda a: a.update(qbs=128.0)),
]


def _flat_base():
    gen = torch.Generator().manual_seed(1)
    return dict(cache=torch.randint(0, 120, (6, V4_PAGE), dtype=U8, generator=gen),
                ids=torch.tensor([5, 0, 23, 7, 11], dtype=I32), ps=4, extra=0, out=None, fp8=False, layout="v4")


def _flat_call(a):
    def call():
        if a["fp8"]:
            return sg.gather_dequant_requant_fp8_paged_dsv4(a["cache"], a["ids"], a["ps"], a["extra"], out=a["out"])
        return sg.dequantize_k_cache_paged_dsv4(a["cache"], a["ids"], a["ps"], out=a["out"], layout=a["layout"])
    return call


def _hook_flat_call(a):
    """SGLang's V4 functions as the hook replaces them (SGLang's own returns a string)."""
    own = lambda *args, **kwargs: "SGLang's own"  # noqa: E731
    name = sglang_dsv4.FUNCTIONS["dsv4_fp8" if a["fp8"] else "dsv4_bf16"]
    hooked = sglang_dsv4._wrap(name, own, lambda *why: None)
    if a["fp8"]:
        return lambda: hooked(a["cache"], a["ids"], a["ps"], a["extra"], out=a["out"])
    return lambda: hooked(a["cache"], a["ids"], a["ps"], out=a["out"], layout=a["layout"])


FLAT_CHANGES = [
    *[(f"cache +{b} bytes", lambda a, b=b: a.update(cache=shifted(a["cache"], b))) for b in (1, 8, 16, 48)],
    ("cache padded pages", lambda a: a.update(cache=torch.zeros(6, V4_PAGE + 16, dtype=U8)[:, :V4_PAGE])),
    ("cache pages +8 bytes", lambda a: a.update(cache=torch.zeros(6, V4_PAGE + 8, dtype=U8)[:, :V4_PAGE])),
    ("cache fp8", lambda a: a.update(cache=a["cache"].view(torch.float8_e4m3fn))),
    ("cache int8", lambda a: a.update(cache=a["cache"].view(torch.int8))),
    ("cache 2 pages", lambda a: a.update(cache=a["cache"][:2])),
    ("cache CSR", lambda a: a.update(cache=hostile_tensors.KINDS["sparse_csr"](a["cache"]))),
    ("ids int64", lambda a: a.update(ids=a["ids"].to(I64))),
    ("ids strided", lambda a: a.update(ids=a["ids"].repeat_interleave(3)[::3])),
    ("ids 2", lambda a: a.update(ids=a["ids"][:2])),
    ("ids none", lambda a: a.update(ids=a["ids"][:0])),
    ("ids +4 bytes", lambda a: a.update(ids=shifted(a["ids"], 4))),
    ("ids 2-D", lambda a: a.update(ids=a["ids"].view(5, 1))),
    ("ids sparse", lambda a: a.update(ids=a["ids"].to_sparse())),
    ("ids float", lambda a: a.update(ids=a["ids"].float())),
    ("ids bad", lambda a: a.update(ids=torch.tensor([5, -1, 24, 2**31 - 1, 3], dtype=I32))),
    *[(f"extra_rows {v!r}", lambda a, v=v: a.update(extra=v, fp8=True)) for v in (0, 3, -1, True, 2.0, 2**31)],
    ("page_size 4.0", lambda a: a.update(ps=4.0)),
    ("page_size 2", lambda a: a.update(ps=2)),
    ("page_size 5", lambda a: a.update(ps=5)),
    ("fp8 form", lambda a: a.update(fp8=True)),
    *[(f"layout {v!r}", lambda a, v=v: a.update(layout=v)) for v in ("v41", "V41_NEW", "v41_fp4", "v41_fp4_new",
                                                                         "V4", "uniform_fp8", 41, None)],
    ("out given", lambda a: a.update(out=torch.empty(5, 1, 512, dtype=torch.float8_e4m3fn if a["fp8"] else
                                                      torch.bfloat16))),
]


def _paged_base():
    gen = torch.Generator().manual_seed(2)
    store = torch.randint(0, 120, (7, 4 * 584 + 16), dtype=U8, generator=gen)
    return dict(out=torch.zeros(2, 9, 512, dtype=torch.bfloat16),
                k_cache=store.as_strided((7, 4, 584), (4 * 584 + 16, 584, 1)),  # padded blocks, as vLLM's
                seq_lens=torch.tensor([7, 5], dtype=I32), gather_lens=torch.tensor([6, 5], dtype=I32),
                block_table=torch.tensor([[3, 1], [6, 0]], dtype=I32), bs=4, offset=2)


def _paged_call(a):
    return lambda: dsv4_gather.dequantize_and_gather_k_cache(a["out"], a["k_cache"], a["seq_lens"], a["gather_lens"],
                                                            a["block_table"], a["bs"], a["offset"])


PAGED_CHANGES = [
    *[(f"out +{b} bytes", lambda a, b=b: a.update(out=shifted(a["out"], b))) for b in (2, 16, 32)],
    ("out rows swapped in memory",
     lambda a: a.update(out=torch.zeros(9, 2, 512, dtype=torch.bfloat16).transpose(0, 1))),
    ("k_cache inside out", lambda a: a.update(k_cache=a["out"].view(-1).view(U8).as_strided((7, 4, 584),
                                                                                           (4 * 584 + 16, 584, 1)))),
    ("k_cache +16 bytes", lambda a: a.update(k_cache=shifted(a["k_cache"], 16))),
    ("k_cache +8 bytes", lambda a: a.update(k_cache=shifted(a["k_cache"], 8))),
    ("k_cache dense", lambda a: a.update(k_cache=a["k_cache"].contiguous())),
    ("gather_lens None", lambda a: a.update(gather_lens=None)),
    ("gather_lens over seq_lens", lambda a: a.update(gather_lens=torch.tensor([8, 5], dtype=I32))),
    ("seq_lens int64", lambda a: a.update(seq_lens=a["seq_lens"].to(I64))),
    ("seq_lens +4 bytes", lambda a: a.update(seq_lens=shifted(a["seq_lens"], 4))),
    ("block_table column-major", lambda a: a.update(block_table=a["block_table"].t().contiguous().t())),
    ("block_table bad ids", lambda a: a.update(block_table=torch.tensor([[3, 9], [-1, 0]], dtype=I32))),
    *[(f"offset {v!r}", lambda a, v=v: a.update(offset=v)) for v in (0, 3, 9, 10, -1, True, 2.0)],
    ("block_size 4.0", lambda a: a.update(bs=4.0)),
]


def _set_base():
    gen = torch.Generator().manual_seed(3)
    return dict(buf=torch.zeros(3, READ_PAGE, dtype=U8), loc=torch.tensor([5, 130, 64]),
                k=torch.randint(0, 256, (3, 128), dtype=U8, generator=gen), s=torch.rand(3, 1, generator=gen))


def _set_call(a):
    return lambda: sg.set_index_k_scale_buffer(a["buf"], a["loc"], a["k"], a["s"])


def _hook_set_call(a):
    pool = types.SimpleNamespace(page_size=64, index_page_size=64, index_head_dim=128, quant_block_size=128)
    execute = sg._set_hook(lambda *args, **kwargs: "SGLang's own")
    return lambda: execute(None, pool=pool, buf=a["buf"], loc=a["loc"], index_k=a["k"], index_k_scale=a["s"])


SET_CHANGES = [
    *[(f"buf +{b} bytes", lambda a, b=b: a.update(buf=shifted(a["buf"], b))) for b in (1, 4, 16)],
    ("k +8 bytes", lambda a: a.update(k=shifted(a["k"], 8))),
    ("k over buf", lambda a: a.update(k=a["buf"].view(-1)[:3 * 128].view(3, 128))),
    ("k fp8", lambda a: a.update(k=a["k"].view(torch.float8_e4m3fn))),
    ("scales 1-D", lambda a: a.update(s=a["s"].view(3))),
    ("scales negative view", lambda a: a.update(s=torch._neg_view(a["s"]))),
    ("scales +4 bytes", lambda a: a.update(s=shifted(a["s"], 4))),
    ("loc int32", lambda a: a.update(loc=a["loc"].to(I32))),
    ("loc past the buffer", lambda a: a.update(loc=torch.tensor([5, 3 * 64, -1]))),
    ("loc 2", lambda a: a.update(loc=a["loc"][:2])),
    ("loc a list", lambda a: a.update(loc=a["loc"].tolist())),
    ("k nested", lambda a: a.update(k=hostile_tensors.KINDS["nested"](a["k"]))),
]

ENTRIES = {"read": (_read_base, _read_call, READ_CHANGES), "hooked read": (_read_base, _hook_call, READ_CHANGES),
           "flat": (_flat_base, _flat_call, FLAT_CHANGES), "hooked flat": (_flat_base, _hook_flat_call, FLAT_CHANGES),
           "paged": (_paged_base, _paged_call, PAGED_CHANGES),
           "set": (_set_base, _set_call, SET_CHANGES), "hooked set": (_set_base, _hook_set_call, SET_CHANGES)}
CASES = [(entry, i) for entry, (_, _, changes) in ENTRIES.items() for i in range(len(changes) + 40)]


def _changed(base, changes, case: int):
    """The base call's arguments with change ``case`` (past the list: a pair drawn by the case's
    seed, redrawn where the second cannot apply to the first's result, e.g. slicing a 0-d tensor)."""
    if case < len(changes):
        args = base()
        changes[case][1](args)  # each single change applies to the base
        return args, [changes[case]]
    rng = random.Random(case)
    while True:
        picked, args = rng.sample(changes, 2), base()
        try:
            for _, change in picked:
                change(args)
        except (IndexError, RuntimeError, NotImplementedError, AttributeError, TypeError):
            continue
        return args, picked


@pytest.mark.parametrize("entry,case", CASES, ids=[f"{e}-{i}" for e, i in CASES])
def test_the_remembered_path_does_what_the_full_checks_do(fake, entry, case):
    base, make_call, changes = ENTRIES[entry]
    args, picked = _changed(base, changes, case)
    what = " + ".join(name for name, _ in picked)
    forget()
    cold = outcome(fake, make_call(args))
    forget()
    assert_remembered(fake, make_call(base()))
    warm = outcome(fake, make_call(args))
    assert warm == cold, f"{entry}, {what}:\n remembered: {warm}\n full checks: {cold}"


# -- every registered op (tests/helpers/op_calls.py's valid calls), changed generically -------------

def _tensor_changes(i: int, name: str, t: torch.Tensor) -> list:
    def put(make):
        return lambda a: a.__setitem__(i, make(a[i]))
    out = [(f"{name} +{b} bytes", put(lambda x, b=b: shifted(x, b))) for b in (1, 2, 4, 8, 16)
           if b % t.element_size() == 0]
    out += [(f"{name} sparse", put(lambda x: torch.zeros(x.shape, dtype=torch.int32 if x.dtype.is_floating_point
                                                         and x.element_size() == 1 else x.dtype).to_sparse())),
            (f"{name} on meta", put(lambda x: x.to("meta"))),
            (f"{name} sparse CSR", put(hostile_tensors.KINDS["sparse_csr"])),
            (f"{name} nested", put(hostile_tensors.KINDS["nested"])),
            (f"{name} quantized", put(hostile_tensors.KINDS["quantized"])),
            (f"{name} a list", put(lambda x: x.tolist())), (f"{name} None", put(lambda x: None))]
    if t.dim():
        out += [(f"{name} one row less", put(lambda x: x[:-1])), (f"{name} rows strided",
                                                                  put(lambda x: x.repeat_interleave(2, 0)[::2]))]
        out.append((f"{name} rows expanded", put(lambda x: x[:1].expand(x.shape))))
    if t.dim() >= 2:
        out.append((f"{name} column-major", put(lambda x: x.transpose(0, 1).contiguous().transpose(0, 1))))
    if t.dtype in (torch.int32, torch.int64):
        out.append((f"{name} other int", put(lambda x: x.to(torch.int64 if x.dtype == torch.int32 else torch.int32))))
    if t.dtype in hostile_tensors.IMAG_DTYPES:
        out.append((f"{name} negative view", put(hostile_tensors.KINDS["negative view"])))
    if t.element_size() == 1:
        out.append((f"{name} as int8", put(lambda x: x.view(torch.int8) if x.dtype != torch.int8 else x.view(U8))))
    return out


def _int_changes(i: int, name: str, v) -> list:
    def put(value):
        return lambda a: a.__setitem__(i, value)
    return [(f"{name} {w!r}", put(w)) for w in (v + 1, v - 1, 0, -1, True, float(v), np.int64(v), None)]


def _inside(i: int, j: int):
    """Tensor i with its metadata over the first bytes of tensor j's storage (torch refuses where
    j's storage is too small or misaligned for i's dtype: that change does not apply)."""
    def change(a):
        t, room = a[i], a[j].untyped_storage()
        need = (t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * \
            t.element_size()
        if room.nbytes() < need:
            raise RuntimeError("too small")
        a[i] = torch.empty(0, dtype=t.dtype).set_(room, 0, t.shape, t.stride())
    return change


def op_changes(op: str) -> list:
    schema = op_calls.registered(op).default._schema
    args = op_calls.calls()[op]()
    out = []
    tensors = [(i, arg.name) for i, (arg, value) in enumerate(zip(schema.arguments, args))
               if isinstance(value, torch.Tensor)]
    out += [(f"{ni} inside {nj}", _inside(i, j)) for i, ni in tensors for j, nj in tensors if i != j]
    for i, (arg, value) in enumerate(zip(schema.arguments, args)):
        if isinstance(value, torch.Tensor):
            out += _tensor_changes(i, arg.name, value)
        elif isinstance(value, int) and not isinstance(value, bool):
            out += _int_changes(i, arg.name, value)
        elif isinstance(value, str):
            out += [(f"{arg.name} {w!r}", lambda a, i=i, w=w: a.__setitem__(i, w))
                    for w in ("auto", "fp8", "ue8m0", "")]
    return [c for c in out if _applies(c[1], lambda: list(op_calls.calls()[op]()))]


def _applies(change, base) -> bool:
    try:
        change(base())
        return True
    except (IndexError, RuntimeError, NotImplementedError, AttributeError, TypeError):  # torch makes no such tensor of the base's
        return False


OPS = {op: op_changes(op) for op in op_calls.calls()}
OP_CASES = [(op, i) for op, changes in OPS.items() for i in range(len(changes) + 30)]


@pytest.mark.parametrize("op,case", OP_CASES, ids=[f"{o}-{i}" for o, i in OP_CASES])
def test_every_ops_remembered_path_does_what_its_full_checks_do(fake, op, case):
    base = lambda: list(op_calls.calls()[op]())  # noqa: E731
    args, picked = _changed(base, OPS[op], case)
    what = " + ".join(name for name, _ in picked)
    call = lambda a: lambda: op_calls.plain(op)(*a)  # noqa: E731
    forget()
    cold = outcome(fake, call(args))
    forget()
    assert_remembered(fake, call(base()), checked=op in EVERY_CALL_CHECKED)
    warm = outcome(fake, call(args))
    assert warm == cold, f"{op}, {what}:\n remembered: {warm}\n full checks: {cold}"


def _remembered_variant(fake, op, case: int):
    """(the call with change A, with A then B): A drawn by the case's seed among the changes whose
    call launches and is remembered (a stride-0 row, a moved pointer, another dtype, ...)."""
    rng = random.Random(10_000 + case)
    changes = OPS[op]
    while True:
        first, second = rng.sample(changes, 2)
        a, ab = list(op_calls.calls()[op]()), list(op_calls.calls()[op]())
        try:
            first[1](a)
            first[1](ab)
            second[1](ab)
        except (IndexError, RuntimeError, NotImplementedError, AttributeError, TypeError):
            continue
        forget()
        got = outcome(fake, lambda: op_calls.plain(op)(*a))
        before = fake.full_checks
        if got[0] != "ran" or not got[1] or outcome(fake, lambda: op_calls.plain(op)(*a)) != got or \
                fake.full_checks != before:
            continue  # A is refused, launches nothing or is not remembered: draw again
        return a, ab, f"{first[0]}, then {second[0]}"


VARIANT_CASES = [(op, i) for op in OPS if op not in EVERY_CALL_CHECKED for i in range(40)]


@pytest.mark.parametrize("op,case", VARIANT_CASES, ids=[f"{o}-{i}" for o, i in VARIANT_CASES])
def test_a_changed_layout_remembered_then_changed_again(fake, op, case):
    """The remembered layout is a changed call's (e.g. a row of stride 0, whose strides a sparse
    tensor of its shape shares), and the next call changes it again: still the full checks'
    outcome."""
    a, ab, what = _remembered_variant(fake, op, case)
    call = lambda args: lambda: op_calls.plain(op)(*args)  # noqa: E731
    forget()
    cold = outcome(fake, call(ab))
    forget()
    assert_remembered(fake, call(a))
    warm = outcome(fake, call(ab))
    assert warm == cold, f"{op}, {what}:\n remembered: {warm}\n full checks: {cold}"


def _same_tensor_pairs() -> list:
    """(op, A, B): a tensor's strides changed (A, remembered), then that tensor made one whose
    bytes are not its values (B): a sparse tensor's strides are zeros, a row of stride 0's too."""
    out = []
    for op, changes in OPS.items():
        if op in EVERY_CALL_CHECKED:
            continue
        named = dict(changes)
        for name in named:
            for a in ("rows expanded", "rows strided", "column-major"):
                if name.endswith(" " + a):
                    tensor = name[:-len(a) - 1]
                    if _accepted_on_cpu(op, named[name]):  # else the full checks refuse A: nothing remembered
                        out += [(op, name, f"{tensor} {b}") for b in ("sparse", "sparse CSR", "nested", "quantized")
                                if f"{tensor} {b}" in named]
    return out


def _accepted_on_cpu(op: str, change) -> bool:
    args = list(op_calls.calls()[op]())
    change(args)
    try:
        op_calls.plain(op)(*args)
        return True
    except (TypeError, ValueError):
        return False


PAIRS = _same_tensor_pairs()


@pytest.mark.parametrize("op,first,second", PAIRS, ids=[f"{o}-{a}-{b}" for o, a, b in PAIRS])
def test_a_strided_layout_remembered_then_a_tensor_without_storage(fake, op, first, second):
    """A sparse tensor's strides are zeros and it has no storage: remembered under a strided
    layout of its shape, it must still get the full checks' TypeError (no registered op accepts
    a tensor whose strides are all zero where such a one could follow: these pass)."""
    named = dict(OPS[op])
    a, ab = list(op_calls.calls()[op]()), list(op_calls.calls()[op]())
    named[first](a)
    named[first](ab)
    named[second](ab)
    call = lambda args: lambda: op_calls.plain(op)(*args)  # noqa: E731
    forget()
    cold = outcome(fake, call(ab))
    forget()
    assert outcome(fake, call(a))[0] == "ran"
    warm = outcome(fake, call(ab))
    assert warm == cold, f"{op}, {first}, then {second}:\n remembered: {warm}\n full checks: {cold}"


def _one_request(a):
    """``a`` with its first request alone (row-major tiles: request-major needs 2 or more)."""
    return dict(a, lens=a["lens"][:1].clone(), pt=a["pt"][:1].clone())


def _long_requests(a):
    """``a`` with a page table of 4,096 columns: max_seq_len up to 262,144, so every row count
    below has a max_seq_len that takes the request-major tiles, and others that do not."""
    return dict(a, pt=a["pt"].repeat(1, 2048))


@pytest.mark.parametrize("batch", [3, 1])
def test_the_read_remembers_each_row_count_and_launches_what_the_full_checks_do(fake, batch):
    """A remembered read keeps each (pointer bits, row count, max_seq_len)'s launch
    (ops/index_k_read.py, ``_call``): every row count and max_seq_len, aligned or not, new or met
    before, launches what the full checks launch for it (the layout's launch rule: row-major or
    request-major tiles), and the layout keeps at most ``_MAX_CALLS`` of them."""
    # the large counts four times running: each with every max_seq_len below
    counts = [80, *range(1, index_k_read._MAX_CALLS + 100), *[n for n in (30_155, 119_994, 131_072, 253_609)
                                                             for _ in range(4)], 80, 7, 1]
    base = (lambda: _long_requests(_read_base())) if batch == 3 else lambda: _one_request(_read_base())
    a = base()
    assert_remembered(fake, _read_call(a))
    layout = index_k_read._layouts.last[2]
    launch = index_k_read.spec.launch_rule(128, 132, batch, True)  # the layout is the fixed one
    shapes = set()
    for i, n in enumerate(counts + counts[::-7]):
        a.update(total=n, longest=min((-(-n // batch), 70, 0, n)[i % 4], a["pt"].size(1) * a["ps"]),
                 buf=shifted(a["buf"], 4) if i % 97 == 1 else base()["buf"])
        warm = outcome(fake, _read_call(a))
        assert len(layout.calls) <= index_k_read._MAX_CALLS
        if i % 41 in (0, 1) or n > 10_000:  # the full checks' launch, memos forgotten (then remembered again)
            forget()
            assert outcome(fake, _read_call(a)) == warm, f"rows {n}"
            assert_remembered(fake, _read_call(base()))
            layout = index_k_read._layouts.last[2]
        tpc, shape, blocks = launch(n, a["longest"])
        shapes.add(shape)
        (name, grid, block, fields), = warm[1]
        assert (name, grid, fields["tokens_per_cta"], fields["num_rows"]) == (
            index_k_read.spec.entry_name(4 if i % 97 == 1 else 16, "i32", "i32", shape, fixed=True), blocks, tpc, n)
    # three requests: every shape, the fixed layout's 256-row request-major tiles included
    assert shapes == (set(index_k_read.spec.SHAPES) | {"req_wide"} if batch == 3 else {"tiny", "", "wide"}), shapes
