"""torch's current CUDA stream as a raw handle, as cheaply as torch allows."""
from __future__ import annotations

import torch

try:  # a C call returning the handle as an int (~0.1 µs)
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:  # torch without it (or a CPU-only build): build a Stream object (~2 µs)
    _raw_stream = None


def current_stream(device: int) -> int:
    """Handle of torch's current stream on CUDA device ``device`` (0 = the legacy default stream)."""
    if _raw_stream is not None:
        return _raw_stream(device)
    return torch.cuda.current_stream(device).cuda_stream
