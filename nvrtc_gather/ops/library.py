"""The ``torch.ops.nvrtc_gather`` library every op registers itself in (ops/gather.py,
ops/indexer_k_quant.py), so that ``torch.compile(fullgraph=True)`` traces callers without a
graph break.

Each op's schema marks the tensors it writes (``Tensor(a!)``) and returns nothing; its fake
(meta) implementation returns nothing too (the ops only write into their arguments) after
checking, where the op gives one, that no output overlaps an input (ops/fake_checks.py). The
low-level ``torch.library.Library`` API with CPU/CUDA kernels is used rather than
``torch.library.custom_op``: the same tracing, at a fraction of the dispatch cost per call.
The plain Python functions stay the documented entry points; inside
torch.compile they route themselves through these ops with :func:`traced`, which puts the op's
guard ``<name>_no_overlap`` in the graph first: the fake's checks again at run time on the real
tensors' addresses (ops/fake_checks.py says why), marked side-effecting so that no backend drops
it. A direct ``torch.ops.nvrtc_gather.<name>`` call in a compiled graph gets the trace-time
checks only."""
from __future__ import annotations

import re

import torch
import torch.fx

from . import fake_checks

NAMESPACE = "nvrtc_gather"
LIBRARY = torch.library.Library(NAMESPACE, "DEF")


# Tensors whose bytes are not their values reach ``fn`` itself, which refuses them naming the
# argument (checks.tensor), as the plain function does: without a kernel here torch would raise
# NotImplementedError (quantized, sparse, nested) or resolve the view first (conjugate, negative).
_REFUSED_BY_FN = ("QuantizedCPU", "QuantizedCUDA", "SparseCPU", "SparseCUDA", "SparseCsrCPU", "SparseCsrCUDA",
                  "NestedTensorCPU", "NestedTensorCUDA", "AutogradNestedTensor", "Conjugate", "Negative")


def _fake(*args) -> None:
    return None


def register(schema: str, fn, fake=None) -> None:
    """Define ``torch.ops.nvrtc_gather.<name>`` with ``schema``, run by ``fn`` on CPU and
    CUDA tensors, with ``fake`` (the op's trace-time checks, returning None) as its fake
    implementation; without one, a fake that does nothing."""
    name = schema.split("(", 1)[0]
    LIBRARY.define(schema)
    for key in ("CPU", "CUDA") + _REFUSED_BY_FN:
        LIBRARY.impl(name, fn, key)
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake or _fake, lib=LIBRARY)
    # A call with a real tensor on the meta device (traced ones are fake tensors, which take
    # ``fake``) would run the fake and write nothing: ``fn`` checks it as the plain function
    # does (a tensor it reads on meta is a ValueError naming it).
    LIBRARY.impl(name, fn, "Meta", allow_override=True)
    if fake is not None:
        guard = f"{name}_no_overlap"
        LIBRARY.define(guard + re.sub(r"\([a-z]!\)", "", schema[len(name):]))  # the same arguments, none written
        for key in ("CPU", "CUDA"):
            LIBRARY.impl(guard, lambda *args: fake_checks.on_addresses(fake, *args), key)
        torch.library.register_fake(f"{NAMESPACE}::{guard}", _fake, lib=LIBRARY)
        torch.fx.node.has_side_effect(getattr(torch.ops.nvrtc_gather, guard).default)
        op = getattr(torch.ops.nvrtc_gather, name)
        ints = tuple((i, a.name) for i, a in enumerate(op.default._schema.arguments) if isinstance(a.type, torch.IntType))
        _GUARDS[name] = (getattr(torch.ops.nvrtc_gather, guard), op, ints)


_GUARDS: dict = {}  # op name -> (its guard, the op, its int arguments as (position, name))


def traced(name: str, *args) -> None:
    """The op ``name`` as a plain function calls it inside torch.compile: its guard, then the op.
    Its int arguments are checked first, as the plain function checks them: the op's schema
    would take a bool as 0 or 1 and refuse a float or None with torch's RuntimeError."""
    guard, op, ints = _GUARDS[name]
    for i, arg in ints:
        traced_int(arg, args[i])
    guard(*args)
    op(*args)


def traced_int(name: str, value) -> None:
    """TypeError naming ``name`` unless ``value`` is an int (not a bool) or a SymInt (a size
    torch.compile keeps symbolic)."""
    if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
        raise TypeError(f"{name}: expected a host int, got {type(value).__name__}")
