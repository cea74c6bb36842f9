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

``--weight-dtype bfloat16`` (or float16): W in that dtype, widened by the kernel a tile at a
time. The torch reference is then F.linear in that dtype (the torch stages of such a model),
and each row also gives ``time_vs_fp32_gemm`` (the kernel on W, over the kernel on W widened
to fp32 beforehand: the cost of widening in the kernel) and ``speedup_vs_sliced_linear``
(over the decode linear NATIVE_MAX_ROWS rows a call: what a bf16 model's chunks ran where the
CPU lacks bf16 arithmetic before the GEMM took narrow weights).

torch's OpenMP threads spin as long as the workers' do (runtime/supervisor.py's
OMP_SPIN_COUNT, unless GOMP_SPINCOUNT is set): libgomp's default keeps them spinning ~4 ms
after each torch call, on the cores the next kernel call needs, which is not what the
kernels meet when serving. libgomp reads it once, as torch loads.
"""

from __future__ import annotations

import os

os.environ.setdefault("GOMP_SPINCOUNT", "3000")  # before torch loads libgomp

import argparse
import statistics

import torch
import torch.nn.functional as F
from common import emit, turns

from dualpace.kernels import cpu
from dualpace.model.native_stages import NATIVE_MAX_ROWS

WEIGHT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def sliced_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The decode linear over x, NATIVE_MAX_ROWS rows a call."""
    return torch.cat([cpu.linear(x[r:r + NATIVE_MAX_ROWS], w)
                      for r in range(0, x.shape[0], NATIVE_MAX_ROWS)])

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
    ap.add_argument("--weight-dtype", choices=tuple(WEIGHT_DTYPES), default="float32")
    args = ap.parse_args()
    wdt = WEIGHT_DTYPES[args.weight_dtype]
    narrow = wdt != torch.float32
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
    out = {"bench": "prefill_gemm", "threads": threads, "weight_dtype": args.weight_dtype,
           "gomp_spincount": os.environ["GOMP_SPINCOUNT"], "paths": {}}
    for isa in isas:
        fma_per_s, lanes = cpu.fma_rate(isa)
        peak = fma_per_s * lanes * 2 * threads
        results = []
        for name in args.shapes.split(","):
            n, k = SHAPES[name]
            w = torch.randn(n, k).to(wdt)
            w32 = w.float()
            for m in (int(r) for r in args.rows.split(",")):
                x = torch.randn(m, k)
                xw = x.to(wdt)
                flop = 2 * m * n * k
                fns = [lambda x=x, w=w, isa=isa: cpu.gemm(x, w, isa=isa),
                       lambda x=xw, w=w: F.linear(x, w)]
                if narrow:
                    fns += [lambda x=x, w=w32, isa=isa: cpu.gemm(x, w, isa=isa),
                            lambda x=x, w=w: sliced_linear(x, w)]
                ours, ref, *more = turns(fns, args.repeats)
                t, t_ref = statistics.median(ours), statistics.median(ref)
                row = {
                    "shape": name, "n": n, "k": k, "rows": m,
                    "gflop_per_s": round(flop / t / 1e9, 1),
                    "fraction_of_fma_peak": round(flop / t / peak, 3),
                    "torch_gflop_per_s": round(flop / t_ref / 1e9, 1),
                    "torch_fraction_of_fma_peak": round(flop / t_ref / peak, 3),
                    "speedup_vs_torch": round(statistics.median(
                        r / o for o, r in zip(ours, ref)), 2),
                }
                if narrow:
                    row["time_vs_fp32_gemm"] = round(statistics.median(
                        o / f for o, f in zip(ours, more[0])), 3)
                    row["speedup_vs_sliced_linear"] = round(statistics.median(
                        s / o for o, s in zip(ours, more[1])), 2)
                results.append(row)
        out["paths"][isa] = {
            "fma_per_core_per_s": round(fma_per_s), "fma_lanes": lanes,
            "fma_peak_gflop_per_s": round(peak / 1e9, 1),
            "min_speedup_vs_torch": min(r["speedup_vs_torch"] for r in results),
            "median_fraction_of_fma_peak": statistics.median(
                r["fraction_of_fma_peak"] for r in results),
            "results": results,
        }
        if narrow:
            out["paths"][isa]["median_time_vs_fp32_gemm"] = statistics.median(
                r["time_vs_fp32_gemm"] for r in results)
    emit(out, args.json)


if __name__ == "__main__":
    main()
