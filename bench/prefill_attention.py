"""The causal prefill attention (cext/prefill_attention.c) against the FMA roofline and
torch's SDPA (the reference, model/attention_ref.py), per ISA path.

    python bench/prefill_attention.py --json

For each head shape (default: the llama.cpp-comparison model's 8 heads of 64, and
Llama-3-8B's 32 query heads over 8 KV heads of 128) and prompt length (default 256 and
1024, one sequence, fp32 q and KV in 16-token blocks): the kernel's and torch's time on
the same inputs, timed in turns, and the causal GFLOP/s of each, 4 Hq D T(T+1)/2 over the
time, as a fraction of the FMA roofline of the same run (``cpu.fma_rate`` x lanes x 2 x
threads). Torch computes the whole T x T square under its mask, so its fraction counts
only the useful half too. ``speedup_vs_torch`` is the median of the per-turn ratios.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from common import emit, turns

from dualpace.kernels import cpu
from dualpace.kernels.prefill_attention import paged_prefill_attention
from dualpace.model.attention_ref import ragged_paged_attention

SHAPES = {"demo-55m": (8, 8, 64), "llama-8b": (32, 8, 128)}  # (Hq, Hkv, D)
BLOCK = 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--shapes", default="demo-55m,llama-8b")
    ap.add_argument("--lengths", default="256,1024")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--isas", default=None,
                    help="comma-separated paths (default: every one this CPU has the kernel on)")
    args = ap.parse_args()
    supported = cpu.supported_isas()
    isas = (args.isas.split(",") if args.isas
            else [i for i in ("avx2", "avx512") if i in supported])
    for isa in isas:
        if isa not in cpu.GEMM_ISAS or isa not in supported:
            ap.error(f"--isas: {isa!r} has no prefill attention kernel on this CPU "
                     f"(it has {supported})")
    for name in args.shapes.split(","):
        if name not in SHAPES:
            ap.error(f"--shapes: unknown {name!r}; known: {', '.join(SHAPES)}")
    lengths = [int(n) for n in args.lengths.split(",")]
    if any(n < 1 for n in lengths):
        ap.error(f"--lengths: every length must be >= 1, got {args.lengths}")
    threads = cpu.num_threads()
    torch.set_num_threads(threads)
    out = {"bench": "prefill_attention", "threads": threads, "block_size": BLOCK, "paths": {}}
    for isa in isas:
        fma_per_s, lanes = cpu.fma_rate(isa)
        peak = fma_per_s * lanes * 2 * threads
        results = []
        for name in args.shapes.split(","):
            hq, hkv, d = SHAPES[name]
            for t in lengths:
                nb = -(-t // BLOCK)
                tables = torch.arange(nb, dtype=torch.int32)[None]
                k, v = torch.randn(nb, hkv, BLOCK, d), torch.randn(nb, hkv, BLOCK, d)
                q = torch.randn(t, hq, d)
                args_ = (q, k, v, tables, [t], [t], d ** -0.5)
                ours, ref = turns([lambda a=args_, i=isa: paged_prefill_attention(*a, isa=i),
                                   lambda a=args_: ragged_paged_attention(*a)], args.repeats)
                flop = 4 * hq * d * t * (t + 1) / 2
                o, r = statistics.median(ours), statistics.median(ref)
                results.append({
                    "shape": name, "heads": hq, "kv_heads": hkv, "head_dim": d, "tokens": t,
                    "ms": round(o * 1e3, 3), "torch_ms": round(r * 1e3, 3),
                    "gflop_per_s": round(flop / o / 1e9, 1),
                    "fraction_of_fma_peak": round(flop / o / peak, 3),
                    "torch_fraction_of_fma_peak": round(flop / r / peak, 3),
                    "speedup_vs_torch": round(statistics.median(
                        b / a for a, b in zip(ours, ref)), 2),
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
