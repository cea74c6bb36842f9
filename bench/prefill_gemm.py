"""The prefill GEMM (cext/gemm.c) against the FMA roofline and torch's GEMM, per ISA path.

    python bench/prefill_gemm.py --json

For each projection shape (default: the llama.cpp-comparison model's QKV, O, gate/up and
down, and Llama-3-8B's QKV and down) at a prefill chunk's rows (default 256): the GFLOP/s
of the kernel and of torch's F.linear on the same fp32 inputs, timed in turns (kernel,
torch, kernel, ...) so both meet the same state of a shared host, and each as a fraction of
the FMA roofline of the same run: ``cpu.fma_rate`` (vector FMAs a second on one core) x
lanes x 2 flops x threads. ``speedup_vs_torch`` is the median of the per-turn ratios. Each
vector path this CPU has is reported (``--isas``), so an AVX-512 host says whether its
tiles beat MKL there too (``cpu_kernels.prefill_gemm_isa`` picks them on AMD's).
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from common import emit, turns

from dualpace.kernels import cpu

SHAPES = {"qkv-512": (1536, 512), "o-512": (512, 512), "gate_up-512": (2752, 512),
          "down-512": (512, 1376), "qkv-8b": (6144, 4096), "down-8b": (4096, 14336)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--shapes", default="qkv-512,o-512,gate_up-512,down-512,qkv-8b,down-8b")
    ap.add_argument("--rows", default="256")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--isas", default=None,
                    help="comma-separated paths (default: every one this CPU has a GEMM on)")
    args = ap.parse_args()
    supported = cpu.supported_isas()
    isas = (args.isas.split(",") if args.isas
            else [i for i in ("avx2", "avx512") if i in supported])
    for isa in isas:
        if isa not in cpu.GEMM_ISAS or isa not in supported:
            ap.error(f"--isas: {isa!r} has no GEMM on this CPU (it has {supported})")
    for name in args.shapes.split(","):
        if name not in SHAPES:
            ap.error(f"--shapes: unknown {name!r}; known: {', '.join(SHAPES)}")
    threads = cpu.num_threads()
    torch.set_num_threads(threads)
    out = {"bench": "prefill_gemm", "threads": threads, "paths": {}}
    for isa in isas:
        fma_per_s, lanes = cpu.fma_rate(isa)
        peak = fma_per_s * lanes * 2 * threads
        results = []
        for name in args.shapes.split(","):
            n, k = SHAPES[name]
            w = torch.randn(n, k)
            for m in (int(r) for r in args.rows.split(",")):
                x = torch.randn(m, k)
                flop = 2 * m * n * k
                ours, ref = turns([lambda x=x, w=w, isa=isa: cpu.gemm(x, w, isa=isa),
                                   lambda x=x, w=w: F.linear(x, w)], args.repeats)
                t, t_ref = statistics.median(ours), statistics.median(ref)
                results.append({
                    "shape": name, "n": n, "k": k, "rows": m,
                    "gflop_per_s": round(flop / t / 1e9, 1),
                    "fraction_of_fma_peak": round(flop / t / peak, 3),
                    "torch_gflop_per_s": round(flop / t_ref / 1e9, 1),
                    "torch_fraction_of_fma_peak": round(flop / t_ref / peak, 3),
                    "speedup_vs_torch": round(statistics.median(
                        r / o for o, r in zip(ours, ref)), 2),
                })
        out["paths"][isa] = {
            "fma_per_core_per_s": round(fma_per_s), "fma_lanes": lanes,
            "fma_peak_gflop_per_s": round(peak / 1e9, 1),
            "min_speedup_vs_torch": min(r["speedup_vs_torch"] for r in results),
            "median_fraction_of_fma_peak": statistics.median(
                r["fraction_of_fma_peak"] for r in results),
            "results": results,
        }
    emit(out, args.json)


if __name__ == "__main__":
    main()
