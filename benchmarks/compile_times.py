"""NVRTC compile time of every kernel module the ops use, one fresh process per module so
each number includes what a serving process pays on its first call with an empty cache
(NVRTC loaded, the module compiled), and again with NVRTC already loaded (the compile alone).

    python benchmarks/compile_times.py [--arch sm_90] [--json OUT.json]

Run first thing on a fresh machine for the cold-host figure (NVRTC's libraries not yet in
the page cache); later runs give the warm one. Needs no GPU."""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

_ONE = r"""
import sys, time, json
t0 = time.perf_counter()
from nvrtc_gather.jit import compiler
from nvrtc_gather import kernels
m = {m.name: m for m in kernels.ALL_MODULES}[sys.argv[1]]
t = compiler.Target(sys.argv[2])
t1 = time.perf_counter()
compiler.compile_module(m, t)            # first: loads NVRTC too
t2 = time.perf_counter()
compiler.compile_module(m, t)            # again: the compile alone
t3 = time.perf_counter()
print(json.dumps({"first_s": t2 - t1, "compile_s": t3 - t2, "import_s": t1 - t0}))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    from nvrtc_gather.jit import compiler
    rows = []
    for m in kernels.ALL_MODULES:
        r = subprocess.run([sys.executable, "-c", _ONE, m.name, args.arch], capture_output=True, text=True, check=True)
        rows.append({"module": m.name, **json.loads(r.stdout.strip().splitlines()[-1])})
        print(f"{m.name:<22} first call {rows[-1]['first_s']:6.2f} s   compile alone {rows[-1]['compile_s']:6.2f} s",
              flush=True)
    result = {"arch": args.arch, "nvrtc": "%d.%d" % compiler.nvrtc_version(), "cpus": os.cpu_count(),
              "machine": platform.node(), "date": time.strftime("%Y-%m-%d"), "modules": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
