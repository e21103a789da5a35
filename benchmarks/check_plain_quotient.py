"""Checks the plain-scale write op's division-free quotient (cuda_src/quant_cache.cu: ng_div_plain,
q = x * RN(1/s) corrected once through the exact fma residual) against the IEEE quotient x / s,
by the fp8 e4m3 code each converts to, for every bf16 (or fp16) x of every quant block that a
bf16 (fp16) amax allows (s = max(amax, 1e-4) / 448). numpy emulates the fmas in float64 (exact
for the residual; the last step may double-round, which could only report a false difference).

    python benchmarks/check_plain_quotient.py bf16|fp16 [STEP]   (every STEP-th amax; 1: all, ~6 min)"""
import sys
import time

import numpy as np
import torch

torch.set_num_threads(2)
def codes(q):  # fp32 -> e4m3 codes, saturating, NaN 0x7f (the kernels' conversion)
    t = torch.from_numpy(q)
    c = t.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(torch.isnan(t), torch.full_like(c, 0x7f), c).numpy()
kind = sys.argv[1]
if kind == "bf16":
    allx = (np.arange(0, 0x10000, dtype=np.uint32) << 16).view(np.float32)
else:
    allx = np.arange(0, 0x10000, dtype=np.uint16).view(np.float16).astype(np.float32)
fin = np.isfinite(allx)
allx = allx[fin]
mags = np.unique(np.abs(allx))
step = int(sys.argv[2])
t0 = time.time(); bad = 0; n = 0
for amax in mags[::step]:
    scale = np.float32(np.maximum(amax, np.float32(1e-4))) / np.float32(448)
    x = allx[np.abs(allx) <= amax]
    inv = np.float32(1) / scale
    q = x * inv
    e = (x.astype(np.float64) - q.astype(np.float64) * np.float64(scale)).astype(np.float32)
    q2 = (q.astype(np.float64) + e.astype(np.float64) * np.float64(inv)).astype(np.float32)
    q2 = np.where(e == 0, q, q2)
    want = x / scale
    c1, c2 = codes(q2), codes(want)
    d = np.nonzero(c1 != c2)[0]
    n += len(x)
    if len(d):
        bad += len(d)
        if bad < 5: print("DIFF amax", amax, "x", x[d[:3]], "q2", q2[d[:3]], "want", want[d[:3]])
print(kind, "scales", len(mags[::step]), "pairs", n, "code differences", bad, f"{time.time()-t0:.0f}s")
