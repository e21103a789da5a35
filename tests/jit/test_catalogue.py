"""The catalogue against the CUDA sources: each parameter struct is declared once in a
``.cuh`` and mirrored in catalogue.py; this test is what keeps the two the same, field by
field (name, kind, order), and the ops' plans in that order."""
import re

import pytest

from nvrtc_gather.jit import catalogue, sources

_KIND = {"i64": "i64", "i32": "i32"}


def cuh_fields(header: str, struct: str) -> list[tuple[str, str]]:
    """(name, "ptr" | "i64" | "i32") of each field of ``struct`` in cuda_src/``header``."""
    text = sources.read_source(header)
    body = re.search(r"struct\s+" + struct + r"\s*\{(.*?)\};", text, re.S).group(1)
    out = []
    for line in body.splitlines():
        line = line.split("//", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"(?:const\s+)?(\w+)\s*(\*?)\s*(\w+)\s*;", line)
        assert m, f"cannot read the field {line!r} of {struct}"
        ctype, star, name = m.groups()
        out.append((name, "ptr" if star else _KIND[ctype]))
    return out


@pytest.mark.parametrize("params,header", [(catalogue.GATHER_PARAMS, "gather_params.cuh"),
                                           (catalogue.QUANT_PARAMS, "quant_params.cuh")], ids=lambda x: str(x)[:20])
def test_param_structs_match_their_headers(params, header):
    assert list(params.fields) == cuh_fields(header, params.name)


def test_the_gather_plan_carries_the_struct_fields_in_order():
    """The op passes GatherPlan[2:] as the struct's values (all but the error buffer)."""
    from nvrtc_gather.ops.gather import GatherPlan
    plan_fields = GatherPlan._fields[2:]
    struct_fields = [name for name, _ in catalogue.GATHER_PARAMS.fields[:-1]]
    renamed = {"kv_ptr": "kv_cache", "k_ptr": "dst_k", "s_ptr": "dst_scale", "bt_ptr": "block_table",
               "cu_ptr": "cu_seq_lens", "dst_k_row_stride": "dst_k_row_stride",
               "dst_scale_row_stride": "dst_scale_row_stride", "bt_row_stride": "bt_row_stride"}
    assert [renamed.get(f, f) for f in plan_fields] == struct_fields


def test_module_names_are_distinct_and_entries_unique():
    names = [m.name for m in catalogue.ALL_MODULES]
    assert len(set(names)) == len(names)
    for m in catalogue.ALL_MODULES:
        assert len(set(m.kernels)) == len(m.kernels)


def test_the_modules_of_an_op_partition_its_entry_points():
    """Each op's entry points are split over its modules (one per vector width; one per entry),
    each exactly once, so every choice an op makes is in the module it loads for it."""
    for entries, modules in ((catalogue.GATHER_ENTRIES, catalogue.GATHER_MODULES),
                             (catalogue.QUANT_ENTRIES, catalogue.QUANT_MODULES)):
        held = [name for m in modules.values() for name in m.kernels]
        assert sorted(held) == sorted(entries.values())
    for (vec, _), name in catalogue.GATHER_ENTRIES.items():
        assert name in catalogue.GATHER_MODULES[vec].kernels
    for key, name in catalogue.QUANT_ENTRIES.items():
        assert catalogue.QUANT_MODULES[key].kernels == (name,)
