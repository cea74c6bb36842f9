"""The decode linear (cext/linear_body.h) against the DRAM roofline and torch's GEMM.

    python bench/cpu_linear.py --json

For each weight shape (default: the llama.cpp-comparison model's QKV, gate/up, down and LM
head, and Llama-3-8B's gate/up and down) and row count M: the kernel's median time, the
weight bytes it streams per second, that rate as a fraction of the DRAM read bandwidth
measured in the same run with the same threads, the achieved GFLOP/s, and torch's F.linear
on the same inputs (x cast to the weights' dtype). Every call reads a different copy of the
weights, copies of twice the last-level cache in turn (256 MB at least; the read bandwidth
is measured over as much), so the weights come from DRAM as in a decode step, not from
cache: with 256 MB of copies a 300 MiB L3 held part of them, and one row of Llama-3-8B's
down projection read at 1.4-1.85x the DRAM rate.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F
from common import dram_read_bandwidth, emit, llc_bytes, median_time

from dualpace.kernels import cpu

SHAPES = {"qkv-512": (1536, 512), "gate_up-512": (2752, 512), "down-512": (512, 1376),
          "lm_head-512": (32000, 512), "gate_up-8b": (28672, 4096), "down-8b": (4096, 14336)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rows", default="1,4,8,16,32")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--isa", default=None, help="scalar | avx2 | avx512 (default: best)")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    threads = cpu.num_threads()
    llc = llc_bytes()
    span = max(256 << 20, 2 * (llc or 0))  # bytes of weight copies a shape cycles through
    bw = dram_read_bandwidth(threads, mib=max(512, span >> 20))
    results = []
    for name in args.shapes.split(","):
        if name not in SHAPES:
            ap.error(f"--shapes: unknown {name!r}; known: {', '.join(SHAPES)}")
        n, k = SHAPES[name]
        nbytes = n * k * dtype.itemsize
        copies = [torch.randn(n, k).to(dtype) for _ in range(max(2, -(-span // nbytes)))]
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k)
            turn = itertools.cycle(copies)
            t = median_time(lambda x=x, turn=turn: cpu.linear(x, next(turn), isa=args.isa),
                            args.repeats)
            # torch's GEMM in the weights' dtype, x cast within the timing (a bf16 x is what
            # the kernel's AMX path rounds to as well; oneDNN takes AMX where the CPU has it)
            t_torch = median_time(lambda x=x, turn=turn: F.linear(x.to(dtype), next(turn)),
                                  args.repeats)
            results.append({
                "shape": name, "n": n, "k": k, "rows": m, "kernel_us": round(t * 1e6, 1),
                "weight_gb_per_s": round(nbytes / t / 1e9, 2),
                "fraction_of_dram_bw": round(nbytes / t / bw, 3),
                "gflop_per_s": round(2 * m * n * k / t / 1e9, 1),
                "torch_us": round(t_torch * 1e6, 1),
                "speedup_vs_torch": round(t_torch / t, 2),
            })
        del copies
    single = [r["fraction_of_dram_bw"] for r in results if r["rows"] == 1]
    emit({"bench": "cpu_linear", "isa": cpu.resolve_isa(args.isa), "threads": threads,
          "dtype": args.dtype, "dram_read_gb_per_s": round(bw / 1e9, 1), "llc_bytes": llc,
          "weight_copies_bytes_per_shape_at_least": span,
          "min_fraction_of_dram_bw_at_1_row": min(single) if single else None,
          "results": results}, args.json)


if __name__ == "__main__":
    main()
