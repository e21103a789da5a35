"""Does the read lose DRAM time to the dirty lines other kernels left in the L2? The bench's flush
(and an engine's kernels before the read) leaves the L2 full of dirty lines; every line the read
brings in evicts one, and a dirty one is written back to DRAM first. The read's source lines are
read once: loaded with the evict-first streaming hint (ld.global.cs, __ldcs) they would be the
ones evicted, with no write-back, instead of other kernels' dirty lines. Arms, SGLang's entry as
it is called (bytes checked equal first): "read" (as shipped), "read_cs" (tile_copy.cuh's value and
scale loads as __ldcs: a variant build of the read's modules), SGLang's Triton read and a copy;
each timed as the bench times it (flushed by zeroing: a dirty L2) and again with the L2 made clean
("_clean": after the spin, untimed, a read of the flush buffer's first 2x L2 bytes, which writes
the dirty lines back and leaves clean ones).

    [REPS=300] [TILES=1] [CLEAN=0] python3 benchmarks/experiments/evict_ab.py [BxM ...]

Prediction (before the run): dirty, read_cs 0.3-2 us faster than read at 8x16384 and 1x131072
(38 and 35 MB moved: the evictions of a dirty L2 add up to the bytes moved again in write-backs),
less on the small rows; clean, read_cs within 0.1 of read, and every arm faster than dirty. If
read_cs is level with read when dirty too, the hint does not steer the L2's evictions (or the
write-backs cost nothing the read waits for).

Run 1 (H100, 300 shuffled runs, medians us; read / read_cs / SGLang / copy, dirty then clean):
8x16384 20.42/20.19/20.00/20.96, 16.26/16.06/16.51/17.20; 1x131072 17.41/17.15/18.05/16.77,
14.59/14.66/15.04/13.15; 2x16384 9.98/9.95/9.82/11.14, 8.58/8.40/9.02/10.16; 16x2048
9.12/9.15/9.09/10.27, 7.97/7.97/8.35/9.33; 1024x256 30.82/30.94/30.69/30.69, 26.24/26.16/25.25/
24.99; 8x100 5.89/5.98/6.21/4.83, 5.66/5.66/6.11/4.80. The hint took 0.23-0.26 off the two large
rows when dirty, nothing elsewhere (below the prediction). Clean, the read is 0.25-0.6 ahead of
SGLang on the request-major rows (as Nsight, which flushes clean, saw): the dirty L2 costs our
read more than SGLang's (8x16384: 4.16 against 3.49 us). SGLang keeps up to 16 16-byte loads in
flight a thread (128 KB an SM at 4 programs), the read 4 (64 KB at 4 blocks): with write-backs
lengthening each miss, more bytes in flight would hide them. Run 2 (TILES=1 CLEAN=0) adds
by_request_ab's t256u8 (96 KB an SM), plain and with the hint. Prediction: t256u8 0.1-0.3 below
read at 8x16384 and level at 2x16384 and 16x2048; t256u8_cs another 0.1-0.2 below t256u8 at
8x16384, level with SGLang (within 0.1). Result (400 runs; read / read_cs / t256u8 / t256u8_cs /
SGLang): 8x16384 20.48/20.29/20.26/20.26/20.29; 2x16384 10.08/10.11/9.98/9.98/10.05; 16x2048
9.25/9.22/9.15/9.09/9.22; 8x8192 13.09/13.09/12.80/12.74/12.83; 4x32768 (wide) 17.63/17.50/18.27/
18.27/17.73; 1x131072 (wide) 17.22/17.06/-/-/18.11. t256u8 0.22 and 0.29 below read at 8x16384 and
8x8192, 0.10 at 2x16384 and 16x2048, level with SGLang or ahead; the hint adds nothing to it. It
became the fixed layout's "req_wide" entry for request-major grids past one wave (NOTES v35)."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/

import torch

import engine_entries as ee
from by_request_ab import tile_variant
from copy_ab import variant, variant_dir
from read_vs_gather import checked, layout_of, medians, read_on, rebuilt
from timing import flush_buffer, l2_bytes, time_samples
from nvrtc_gather.integrations import sglang as hook
from nvrtc_gather.kernels import index_k_read as spec

REPS = int(os.environ.get("REPS", 300))
TILES = os.environ.get("TILES") == "1"  # the t256u8 arms too (rows of 2 or more requests)
CLEAN = os.environ.get("CLEAN", "1") == "1"  # the _clean arms
WORKLOADS = [(8, 16384), (1, 131072), (2, 16384), (16, 2048), (1024, 256), (8, 100)]


def streaming(header: str) -> str:
    """tile_copy.cuh with its three tile loads as __ldcs (copy_ab.variant_dir's edit)."""
    assert header.count("__ldg(reinterpret_cast") == 3, "tile_copy.cuh's tile loads changed"
    return header.replace("__ldg(reinterpret_cast", "__ldcs(reinterpret_cast")


def main(workloads):
    flush, acc, p = flush_buffer(), ee.accessor(), ee.pool()
    cs_dir = variant_dir(None, streaming)
    cs = variant(spec.MODULES, "cs", cs_dir, {})
    clean_n = 2 * l2_bytes() // 4
    clean = lambda: flush[:clean_n].sum()  # noqa: E731  reads 2x the L2: dirty lines written back, clean ones left
    print(torch.cuda.get_device_name(), torch.__version__, "SGLang:", "yes" if acc else "no", flush=True)
    for batch, mean in workloads:
        w = ee.Workload(batch, mean)
        fns = {"read": lambda: hook.get_index_k_scale_buffer(*w.get_args())}
        fns["read"]()  # its layout remembered
        lay = rebuilt(layout_of(w), cs)
        fns["read_cs"] = read_on(lay, w)
        if TILES and batch >= 2:  # t256u8 (by_request_ab's tiles), plain and with __ldcs
            for name, d in (("t256u8", None), ("t256u8_cs", cs_dir)):  # 80 registers: 3 blocks an SM
                t = tile_variant(layout_of(w), batch, 256, 8, 3, d, "_cs" if d else "")
                fns[name] = read_on(t, w)
        fns = checked(fns, w, acc, p)  # + sglang, copy
        pre = {}
        for name in list(fns) if CLEAN else ():
            fns[f"{name}_clean"] = fns[name]
            pre[f"{name}_clean"] = clean
        got = time_samples(fns, flush, REPS, order="shuffle", pre=pre)
        print(f"{w.name} ({layout_of(w).launch(w.tokens, w.longest)}): " + medians(got), flush=True)
        w = fns = lay = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main([tuple(int(x) for x in a.split("x")) for a in sys.argv[1:]] or WORKLOADS)
