"""Argument checks shared by the ops. Each raises TypeError/ValueError naming the argument
and saying what was expected; none touches tensor data (no device sync)."""
from __future__ import annotations

import torch

INT32_MAX = 2**31 - 1


def tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
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
            "pass a tensor whose data pointer and row stride are 4-byte aligned"
        )


def same_device(named: dict[str, torch.Tensor]) -> torch.device:
    it = iter(named.items())
    first_name, first = next(it)
    dev = first.device
    for name, t in it:
        if t.device != dev:
            raise ValueError(
                f"{name}: expected a tensor on {dev} like {first_name}, got one on {t.device}; "
                "all tensors of one call must be on the same device"
            )
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{first_name}: tensors on {dev.type} are not supported (use cpu or cuda)")
    return dev


def disjoint(written: dict[str, tuple[int, int]], read: dict[str, tuple[int, int]]) -> None:
    """Raise ValueError naming both arguments if a written byte range [start, end) overlaps a
    read one: on a GPU that is a race between the kernel's own loads and stores. Ranges are
    the tensors' address spans, so a strided view counts with its gaps."""
    for w, (w_lo, w_hi) in written.items():
        for r, (r_lo, r_hi) in read.items():
            if w_lo < r_hi and r_lo < w_hi:
                raise ValueError(
                    f"{w}: its memory overlaps {r} (bytes [{w_lo:#x}, {w_hi:#x}) and [{r_lo:#x}, {r_hi:#x})); "
                    f"the op reads {r} while it writes {w}, so they must not share storage")


def extent(t: torch.Tensor, rows: int | None = None) -> int:
    """Bytes from ``t``'s data pointer to the end of its last element (its address span, gaps
    of a strided view included); 0 when empty. ``rows``: only its first rows count."""
    shape = list(t.shape)
    if rows is not None and shape:
        shape[0] = min(shape[0], rows)
    if not shape:
        return t.element_size()
    if 0 in shape:
        return 0
    return (sum((n - 1) * s for n, s in zip(shape, t.stride())) + 1) * t.element_size()


def plain_int(name: str, value) -> int:
    """An int argument (a bool or a tensor is refused: torch would coerce either silently)."""
    if type(value) is int:
        return value
    if isinstance(value, bool) or not hasattr(value, "__index__") or isinstance(value, torch.Tensor):
        what = f"a {value.dtype} tensor" if isinstance(value, torch.Tensor) else type(value).__name__
        raise TypeError(f"{name}: expected an int, got {what}")
    return value.__index__()
