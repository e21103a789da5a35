"""Argument checks shared by the ops. Each raises TypeError/ValueError naming the argument
and saying what was expected; none touches tensor data (no device sync)."""
from __future__ import annotations

import operator
import re

import torch

INT32_MAX = 2**31 - 1


def type_name(value) -> str:
    """The type of ``value`` as a message names it: ``int`` for builtins, else with its module
    (``numpy.bool``, not a bare ``bool`` that reads as Python's own)."""
    cls = type(value)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def tensor(name: str, t) -> torch.Tensor:
    """A dense tensor whose bytes are its values: a sparse, nested, quantized tensor or a
    conjugate or negative view (whose values are not its bytes) is a TypeError naming it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type_name(t)}")
    if t.is_nested or t.layout != torch.strided:
        what = "a nested tensor" if t.is_nested else f"a {t.layout} tensor"
        raise TypeError(f"{name}: expected a dense (strided) tensor, got {what}; pass .to_dense() or a plain tensor")
    if t.is_quantized:
        raise TypeError(f"{name}: expected a plain tensor, got a quantized one ({t.dtype}); pass .int_repr()")
    if t.is_conj() or t.is_neg():
        what = "conjugate" if t.is_conj() else "negative"
        raise TypeError(f"{name}: expected a plain tensor, got a {what} view (its bytes are not its values); "
                        f"pass .resolve_{what[:3]}()")
    return t


def dtype_in(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> torch.dtype:
    dt = t.dtype
    if dt not in allowed:
        want = " or ".join(str(a) for a in allowed)
        raise TypeError(f"{name}: expected dtype {want}, got {dt}")
    return dt


def rank(name: str, t: torch.Tensor, n: int, shape_doc: str) -> None:
    if t.dim() != n:
        raise ValueError(f"{name}: expected {n} dimensions {shape_doc}, got shape {tuple(t.shape)}")


def unit_inner_stride(name: str, t: torch.Tensor) -> None:
    """The last dimension must be contiguous (rows may be strided)."""
    if t.size(-1) > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name}: the last dimension must be contiguous (stride 1), got strides {tuple(t.stride())}; "
            "pass a row-strided view or call .contiguous()"
        )


def fits_int32(name: str, what: str, value: int) -> None:
    if value > INT32_MAX:
        raise ValueError(f"{name}: {what} = {value} exceeds the supported maximum {INT32_MAX}")


def aligned(name: str, what: str, value: int, to: int = 4) -> None:
    if value % to:
        raise ValueError(
            f"{name}: {what} ({value}) must be a multiple of {to} bytes for aligned device access; "
            f"pass a tensor whose data pointer and row stride are {to}-byte aligned"
        )


def same_device(named: dict[str, torch.Tensor]) -> torch.device:
    """The one device of a call's tensors (``named``: by position). Else a ValueError naming the
    odd one out: the first tensor not on the device most of them are on (a tie: a cpu or cuda
    device before another, then the earliest), so one tensor moved elsewhere is named whichever
    position it has, and of two tensors the one on a device the ops do not run on."""
    devices = [t.device for t in named.values()]
    dev = devices[0]
    if any(d != dev for d in devices):
        dev = max(devices, key=lambda d: (devices.count(d), d.type in ("cpu", "cuda"), -devices.index(d)))
        names = list(named)
        like = names[devices.index(dev)]
        name = next(n for n, d in zip(names, devices) if d != dev)
        raise ValueError(
            f"{name}: expected a tensor on {dev} like {like}, got one on {named[name].device}; "
            "all tensors of one call must be on the same device"
        )
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{next(iter(named))}: tensors on {dev.type} are not supported (use cpu or cuda)")
    return dev


def _hex(offset) -> str:
    """A byte offset as a message writes it: hex, or as it is when traced (a SymInt under
    ``torch.compile(dynamic=True)`` has no hex format)."""
    return f"{offset:#x}" if isinstance(offset, int) else str(offset)


def disjoint(written: dict[str, tuple[int, int]], read: dict[str, tuple[int, int]]) -> None:
    """Raise ValueError naming both arguments if a written byte range [start, end) overlaps a
    read one: on a GPU that is a race between the kernel's own loads and stores. Ranges are
    the tensors' address spans, so a strided view counts with its gaps."""
    for w, (w_lo, w_hi) in written.items():
        for r, (r_lo, r_hi) in read.items():
            if w_lo < r_hi and r_lo < w_hi and w_lo < w_hi and r_lo < r_hi:  # an empty range touches nothing
                raise ValueError(
                    f"{w}: its memory overlaps {r} (bytes [{_hex(w_lo)}, {_hex(w_hi)}) and "
                    f"[{_hex(r_lo)}, {_hex(r_hi)})); "
                    f"the op reads {r} while it writes {w}, so they must not share storage")



def rows_disjoint(a: int, a_width: int, b: int, b_width: int, row_stride: int, rows: int) -> bool:
    """Whether ``rows`` rows of ``a_width`` bytes from ``a`` and of ``b_width`` bytes from ``b``,
    both ``row_stride`` bytes apart, share no byte: columns of one buffer carved side by side
    (``buf[:, :128]``, ``buf[:, 128:]``) are disjoint though their address spans overlap."""
    if rows < 1 or a + (rows - 1) * row_stride + a_width <= b or b + (rows - 1) * row_stride + b_width <= a:
        return True
    if rows == 1 or row_stride < a_width + b_width:
        return False
    d = (b - a) % row_stride  # b's columns in a's row frame
    return a_width <= d and d + b_width <= row_stride


def written_apart(name_a: str, a: int, a_width: int, a_stride: int, name_b: str, b: int, b_width: int,
                  b_stride: int, rows: int) -> None:
    """Raise ValueError naming both when two outputs of ``rows`` rows each (widths and row
    strides in bytes) share a byte: which write lands there would be unspecified. Different
    row strides are judged by the rows' address spans."""
    stride = a_stride if a_stride == b_stride else 0
    if stride and rows_disjoint(a, a_width, b, b_width, stride, rows):
        return
    a_end, b_end = a + (rows - 1) * a_stride + a_width, b + (rows - 1) * b_stride + b_width
    if rows and a < b_end and b < a_end:
        raise ValueError(f"{name_a}: its memory overlaps {name_b} (bytes [{_hex(a)}, {_hex(a_end)}) and "
                         f"[{_hex(b)}, {_hex(b_end)})); "
                         f"the op writes both, so they must not share a byte")


def int_arg(name: str, value, tensors: bool = False) -> int:
    """An int argument. A bool is refused (torch would coerce it silently); a tensor only with
    ``tensors`` (an int tensor of one element counts, through __index__; reading a CUDA one
    syncs); anything else without __index__ is a TypeError naming the argument."""
    if type(value) is int:
        return value
    is_tensor = isinstance(value, torch.Tensor)
    what = f"a {value.dtype} tensor" if is_tensor else type_name(value)
    if isinstance(value, bool) or not hasattr(value, "__index__") or (is_tensor and not tensors):
        raise TypeError(f"{name}: expected an int, got {what}")
    try:
        return operator.index(value)
    except TypeError:  # e.g. a float tensor: torch's own message would not name the argument
        raise TypeError(f"{name}: expected an int, got {what}") from None


def disjoint_from(written: str, written_ptr: int, read_names: tuple, read_ptrs: tuple, extents: tuple) -> None:
    """``disjoint`` for one written range (``extents[0]`` bytes from ``written_ptr``) against
    several read ones (``extents[i + 1]`` bytes from ``read_ptrs[i]``; 0: not read): the
    message of a call fast_path.overlapping refused."""
    disjoint({written: (written_ptr, written_ptr + extents[0])},
             {n: (ptr, ptr + size) for n, ptr, size in zip(read_names, read_ptrs, extents[1:]) if size})


def renamed(message: str, names: dict[str, str]) -> str:
    """``message`` with each argument name of ``names`` (whole words) replaced by the caller's
    name for that argument: an entry that wraps an op raises in its own caller's terms."""
    return re.sub(r"\b(" + "|".join(map(re.escape, names)) + r")\b", lambda m: names[m.group(1)], message)


def host_int(name: str, value, *, positive: bool = False) -> int:
    """``value`` as a host int (not a bool, float, string or tensor), >= 0 (> 0 if ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected a host int, got {type(value).__name__}"
                        + (" (a tensor: pass the value, e.g. int(t), computed where the host already has it)"
                           if isinstance(value, torch.Tensor) else ""))
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name}: expected a {'positive' if positive else 'non-negative'} int, got {value}")
    return value
