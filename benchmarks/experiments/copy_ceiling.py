"""Where the chunked gathers' ceiling sits (one large request at 1.10-1.14x a device copy_ of
the same bytes): the copy_ against a contiguous copy written as a kernel of the tile kernel's
shape (copy_ceiling.cu: 256 threads, 4 x 16-byte loads in flight per thread, 16 KiB per block),
at the bytes the chunked rows move (1x65536 and 1x131072 cp_gather, 8x16384, 256x1000). Each
copy checked byte for byte, then timed interleaved, L2 flushed before each run.

    PYTHONPATH=. python benchmarks/experiments/copy_ceiling.py"""
import dataclasses
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the timing module
from timing import flush_buffer, summarize, time_samples  # noqa: E402
from nvrtc_gather.jit import runtime, sources  # noqa: E402
from nvrtc_gather.jit.spec import Entry  # noqa: E402
from nvrtc_gather.kernels import cache_gather as spec  # noqa: E402

build = Path(tempfile.mkdtemp())
(build / "copy_exp.cu").write_text(sources.read_source("cache_gather.cu")
                                   + (Path(__file__).parent / "copy_ceiling.cu").read_text())
KCOPY = dataclasses.replace(spec.MODULES["copy", (16, 16)], name="copy_exp", source="copy_exp.cu",
                            source_dir=str(build), entries=(Entry("exp_kcopy"),))
DEV = torch.cuda.current_device()


def kernel_copy(src: torch.Tensor, dst: torch.Tensor):
    fields = {n: 0 for n in spec.PARAMS.names if n != "error"}
    fields.update(src_cache=src.data_ptr(), dst=dst.data_ptr(), block_stride=src.numel())
    go = runtime.load(KCOPY, DEV, runtime.current_stream(DEV)).launcher("exp_kcopy", -(-src.numel() // 16384),
                                                                        spec.PARAMS.image(**fields))
    return lambda _keep=(src, dst): go(())


flush = flush_buffer()
print("contiguous copies, µs (moved = read + written)")
for moved in (75497472, 150994944, 167006592, 288734976):
    src = torch.randint(0, 256, (moved // 2,), dtype=torch.uint8, device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(moved))
    d, dcopy = torch.zeros_like(src), torch.empty_like(src)
    fns = {"kernel": kernel_copy(src, d), "copy_": lambda: dcopy.copy_(src)}
    fns["kernel"]()
    torch.cuda.synchronize()
    assert torch.equal(d, src)
    row = {}
    summarize(row, time_samples(fns, flush, 200))
    print(f"{moved / 1e6:8.1f} MB: copy_ {row['copy__us']:.2f}, kernel {row['kernel_us']:.2f} "
          f"({row['kernel_us'] / row['copy__us']:.3f}x copy_)", flush=True)
    src = d = dcopy = fns = None
    torch.cuda.empty_cache()
