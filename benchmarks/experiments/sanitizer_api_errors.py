"""Which driver call of ours makes compute-sanitizer report CUDA_ERROR_INVALID_VALUE on
cuGetProcAddress (issue 36.8): run ``python sanitizer_api_errors.py N`` under
``compute-sanitizer --report-api-errors all`` for N = 0.. len(STEPS); each run makes the first N
calls after torch has initialised CUDA. The first N whose count jumps names the call."""
import sys

import torch

from nvrtc_gather.jit import driver

STEPS = [("init", lambda: driver.init()), ("device_count", lambda: driver.device_count()),
         ("capability", lambda: driver.capability(0)), ("sm_count", lambda: driver.sm_count(0)),
         ("primary_context", lambda: driver.primary_context(0)), ("raw", lambda: driver.raw()),
         ("stream_is_capturing", lambda: driver.stream_is_capturing(torch.cuda.current_stream().cuda_stream)),
         ("preload", lambda: __import__("nvrtc_gather").preload(0))]

if __name__ == "__main__":
    torch.zeros(1, device="cuda")
    n = int(sys.argv[1])
    for name, step in STEPS[:n]:
        step()
    print("ran", [name for name, _ in STEPS[:n]])
