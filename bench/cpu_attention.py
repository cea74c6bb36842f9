"""CPU paged decode attention: the cext kernel vs DRAM bandwidth vs a torch reference.

    python bench/cpu_attention.py --json

For B x context, with KV in bf16 and fp32: kernel time (median), KV bytes read per second,
the fraction of the DRAM read bandwidth (a C/OpenMP streaming read with the same thread
count), and the torch gather + scaled_dot_product_attention reference. Each kernel timing is
paired with a streaming read right after it and the fraction is the median of the pairs'
ratios: on a shared host the bandwidth drifts by a quarter within a minute, and one reading
at the start put some rows above 1.0. kernel_ms and the ratio to torch come from a plain
repeat loop, as torch's time does.
Shape per layer: Hq=32, Hkv=8, head_dim=128 (Llama-3-8B), block size 16.

--grid adds the issue's shape grid at 32 sequences x at least 1024 tokens (32k KV tokens,
Hkv=8): GQA groups 1/4/8 (--grid-groups) x head dims 64/80/96/128 x block sizes 16/32/64,
for each dtype, and min_fraction_of_dram_bw_grid. Each row's context is long enough that its
K and V fill twice the last-level cache (``llc_bytes``, from sysfs; --grid-min-kv-mb), and
the reference read is that size too: on a Xeon VM with a 300 MiB L3 the 32k-token rows
(17-134 MB) read from the L3 at up to 1.8x the streaming rate, which says nothing of DRAM.
Each row says whether the path took bf16 dot products (``bf16_dot``) or AMX tiles
(``amx_tiles``, the ``amx`` path at GQA 8: no FMA ceiling there). The grid runs
--grid-passes times over (default 3) and each row is the pass with its median fraction
(``fraction_samples``: every pass's): on this shared box a slow spell lasts seconds, so
three measurements of a row in a row were all low together (bf16 G1 D64 block 16: 0.25 /
0.25 / 0.27, 0.83-1.03 in other runs), and a single pass put 13-44 of the 72 rows below 0.70
from one run to the next.

The compute ceiling beside the memory one: ``fma_per_core_per_s`` is the path's vector-FMA
throughput on one core (cpu.fma_rate), and each row's ``fma_bound_fraction`` the fraction of
the DRAM bandwidth that a kernel doing nothing but its dot products' FMAs at that rate could
reach (fma_bound_gb_per_s over the run's median read bandwidth, at most 1). Where it is
below 0.70 the shape is compute-bound on this core whatever the kernel's overheads (on a
Zen 1, one 256-bit FMA a cycle: GQA 8, head dim 128, bf16, ~0.6 at 15 GB/s).

And the kernel's own compute pace: each row is timed again with its block tables folded onto
as many blocks as half the L2 holds (``hot_pool``: the same calls, only every read hits the
cache), ``in_cache_gb_per_s`` and ``in_cache_fraction`` (over the DRAM read). A row below
0.70 from DRAM whose in-cache fraction is 0.70 or more loses on the overlap of its reads and
its compute; one below 0.70 in cache too is bound by its instructions, which the FMA
fraction alone does not show (on a Zen 3, GQA 8 took 1.8x the time of its FMAs).
``grid_below_goal_compute_bound`` and ``grid_below_goal_overlap_bound`` count the two.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time

import torch
from common import emit, l2_bytes, llc_bytes, median_time

from dualpace.kernels import cpu
from dualpace.model.attention_ref import paged_decode_attention_ref

# Above this many elements a KV tensor is a random pool repeated: randn over a GB-sized
# cache took seconds a row, and the values do not change the kernel's speed.
RANDOM_POOL = 1 << 22


def random_kv(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    n = math.prod(shape)
    if n <= RANDOM_POOL:
        return torch.randn(shape, generator=g).to(dtype)
    pool = torch.randn(RANDOM_POOL, generator=g).to(dtype)
    return pool.repeat(-(-n // RANDOM_POOL))[:n].view(shape)


def case(batch: int, ctx: int, hq: int, hkv: int, d: int, bs: int, dtype: torch.dtype):
    per = -(-ctx // bs)
    nb = batch * per
    g = torch.Generator().manual_seed(0)
    k = random_kv((nb, hkv, bs, d), dtype, g)
    v = random_kv((nb, hkv, bs, d), dtype, g)
    q = torch.randn(batch, hq, d, generator=g)
    tables = torch.randperm(nb, generator=g).int().view(batch, per)
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    return q, k, v, tables, lens


def fma_bound_gb_per_s(group: int, head_dim: int, elem_size: int, lanes: int,
                       fma_per_s: float, threads: int, bf16_dot: bool) -> float:
    """KV bytes per second (GB/s) of a kernel that did nothing but its dot products' vector
    FMAs at ``fma_per_s`` per core on ``threads`` cores. Per token and KV head QK and PV take
    group * head_dim / lanes FMAs each (bf16 dot products, two products a lane, counted as
    FMAs of half as many instructions), and bring 2 * head_dim * elem_size bytes of K and V."""
    fmas = 2 * group * head_dim / lanes / (2 if bf16_dot else 1)
    return 2 * head_dim * elem_size * fma_per_s * threads / fmas / 1e9


def hot_pool(tables: torch.Tensor, cache_bytes: int, block_bytes: int) -> tuple[int, torch.Tensor]:
    """The block tables of a row's in-cache twin: every sequence's blocks folded onto the
    first ``n`` blocks (n * block_bytes of K and V within ``cache_bytes``, at least one),
    block b -> b mod n. The same calls, contexts and block order per sequence, only every
    read hits the cache: the kernel's compute pace at the row's very shape, which a small
    context would hide under the per-call costs (q's repack, the segments' merge)."""
    n = max(1, cache_bytes // block_bytes)
    return n, torch.remainder(tables, n).to(tables.dtype)


def grid_context(min_kv_bytes: int, batch: int, hkv: int, head_dim: int, elem_size: int,
                 block_size: int, floor: int = 1024) -> int:
    """The context of a grid row: at least ``floor`` tokens (the issue's 32 x 1024 = 32k) and
    enough that the row's K and V (batch x context x hkv x head_dim x 2 x elem_size bytes)
    reach ``min_kv_bytes``, in whole blocks. A KV the last-level cache holds is read from
    there: on a Xeon VM with a 300 MiB L3 the 32k-token rows read at up to 1.8x the
    streaming DRAM rate."""
    per_token = batch * hkv * head_dim * 2 * elem_size
    ctx = max(floor, -(-min_kv_bytes // per_token))
    return -(-ctx // block_size) * block_size


def parse_groups(text: str) -> tuple[int, ...]:
    """--grid-groups: comma-separated GQA group sizes, each a positive integer."""
    try:
        groups = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--grid-groups: expected comma-separated integers, got {text!r}") \
            from None
    if not groups or any(g < 1 for g in groups):
        raise ValueError(f"--grid-groups: group sizes must be positive, got {text!r}")
    return groups


def median_pass(samples: list[dict]) -> dict:
    """Of one grid row's passes, the one with the median ``fraction_of_dram_bw`` (the upper
    median of an even count: a measured row, never an average of two), with every pass's
    fraction and kernel time in ``fraction_samples`` and ``kernel_ms_samples``, in pass
    order (a fraction that moves while the time stays is the DRAM bandwidth moving)."""
    if not samples:
        raise ValueError("median_pass: no passes")
    ranked = sorted(samples, key=lambda r: r["fraction_of_dram_bw"])
    return {**ranked[len(ranked) // 2],
            "fraction_samples": [r["fraction_of_dram_bw"] for r in samples],
            "kernel_ms_samples": [r["kernel_ms"] for r in samples]}


def paired_times(kernel, stream, repeats: int) -> tuple[list[float], list[float]]:
    """Wall times of kernel() and of stream() run right after it, ``repeats`` pairs. Each
    timed kernel call follows an untimed one: right after a 256 MiB read a call took ~0.25 ms
    longer whatever its size, which would bury the small shapes."""
    kernel()
    stream()
    tk, ts = [], []
    for _ in range(repeats):
        kernel()
        t0 = time.perf_counter()
        kernel()
        t1 = time.perf_counter()
        stream()
        tk.append(t1 - t0)
        ts.append(time.perf_counter() - t1)
    return tk, ts


_KV_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32,
              "fp32": torch.float32, "f32": torch.float32, "float16": torch.float16,
              "fp16": torch.float16, "f16": torch.float16}


def kv_dtype(name: str) -> torch.dtype:
    """--dtypes' names: torch's (bfloat16, float32, float16) or the short ones (bf16, fp32)."""
    try:
        return _KV_DTYPES[name.strip().lower()]
    except KeyError:
        raise ValueError(f"--dtypes: unknown KV dtype {name!r}; expected one of "
                         f"{', '.join(sorted(_KV_DTYPES))}") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--batches", default="1,8,32,128")
    ap.add_argument("--contexts", default="128,1024,4096")
    ap.add_argument("--dtypes", default="bfloat16,float32",
                    help="KV dtypes, comma-separated: bfloat16 (bf16), float32 (fp32, f32), "
                         "float16 (fp16, f16)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--isa", default=None,
                    help="scalar | avx2 | avx512 | avx512_bf16 | amx (default: the best this CPU "
                         "has; amx runs attention as avx512_bf16 does)")
    ap.add_argument("--grid", action="store_true",
                    help="also the GQA x head-dim x block-size grid at 32k tokens")
    ap.add_argument("--grid-passes", type=int, default=3,
                    help="passes over the grid; each row is its median pass")
    ap.add_argument("--grid-groups", default="1,4,8",
                    help="GQA groups of the grid (the issue's 1,4,8; add 5 for Qwen3-14B's 40 "
                         "over 8 heads, 7 for Qwen2.5-7B's 28 over 4)")
    ap.add_argument("--grid-min-kv-mb", type=int, default=None,
                    help="each grid row's K and V at least this many MiB, by a longer "
                         "context (default: twice the last-level cache, so that the rows "
                         "read DRAM; 0: the issue's 32k tokens whatever the cache)")
    ap.add_argument("--ref-max-tokens", type=int, default=131072,
                    help="skip the (slow, memory-hungry) torch reference above B x context")
    args = ap.parse_args()
    if args.grid_passes < 1:
        raise SystemExit("cpu_attention: --grid-passes must be at least 1")
    try:
        grid_groups = parse_groups(args.grid_groups)
    except ValueError as e:
        raise SystemExit(f"cpu_attention: {e}") from None
    if args.grid_min_kv_mb is not None and args.grid_min_kv_mb < 0:
        raise SystemExit("cpu_attention: --grid-min-kv-mb must be 0 or more")
    hq, hkv, d, bs = 32, 8, 128, 16
    threads = cpu.num_threads()
    llc = llc_bytes()
    hot_bytes = (l2_bytes() or 256 << 10) // 2  # the in-cache twins' KV (hot_pool)
    grid_min_kv = (args.grid_min_kv_mb << 20 if args.grid_min_kv_mb is not None
                   else 2 * (llc or 256 << 20))
    # the reference read twice the last-level cache too, or it partly reads that cache
    sbuf = torch.ones(max(256 << 20, 2 * (llc or 0)) // 4)
    sbytes = sbuf.numel() * 4
    stream = functools.partial(cpu.stream_read, sbuf, threads)
    bw_samples = []
    rows = []
    try:
        fma_per_s, lanes = cpu.fma_rate(args.isa)
    except ValueError:  # the scalar path
        fma_per_s, lanes = None, None
    def measure(b, ctx, hq_, hkv_, d_, bs_, dtype, with_ref):
        q, k, v, t, sl = case(b, ctx, hq_, hkv_, d_, bs_, dtype)
        qd = q.to(dtype)
        kernel = functools.partial(cpu.paged_decode_attention, qd, k, v, t, sl, d_**-0.5,
                                   isa=args.isa)
        tks, tss = paired_times(kernel, stream, args.repeats)
        bw_samples.extend(sbytes / t for t in tss)
        # the time (and the ratio to torch) from a plain loop, as torch's is taken
        tk = median_time(kernel, args.repeats)
        kv_bytes = 2 * b * ctx * hkv_ * d_ * k.element_size()
        frac = statistics.median(kv_bytes / a / (sbytes / c) for a, c in zip(tks, tss))
        row = {"dtype": str(dtype).removeprefix("torch."), "batch": b, "context": ctx,
               "tokens": b * ctx, "kv_bytes": kv_bytes, "kernel_ms": round(tk * 1e3, 3),
               "kv_gb_per_s": round(kv_bytes / tk / 1e9, 2),
               "fraction_of_dram_bw": round(frac, 3),
               "bf16_dot": cpu.attention_uses_bf16_dot(dtype, dtype, hq_ // hkv_, d_,
                                                       isa=args.isa, block_size=bs_),
               "amx_tiles": cpu.attention_uses_amx(dtype, dtype, hq_ // hkv_, d_, bs_,
                                                   isa=args.isa)}
        # the same call with every block read from half the L2: the compute pace; a row
        # under 0.70 of the DRAM read here cannot reach it from DRAM whatever the prefetching
        nhot, hot_tables = hot_pool(t, hot_bytes, 2 * k[0].numel() * k.element_size())
        hot = functools.partial(cpu.paged_decode_attention, qd, k[:nhot], v[:nhot],
                                hot_tables, sl, d_**-0.5, isa=args.isa)
        row["in_cache_gb_per_s"] = round(kv_bytes / median_time(hot, args.repeats) / 1e9, 2)
        if fma_per_s and not row["amx_tiles"]:  # tile products are no FMAs
            row["fma_bound_gb_per_s"] = round(fma_bound_gb_per_s(
                hq_ // hkv_, d_, k.element_size(), lanes, fma_per_s, threads,
                row["bf16_dot"]), 2)
        if with_ref and b * ctx <= args.ref_max_tokens:
            ref = functools.partial(paged_decode_attention_ref, qd, k, v, t, sl, d_**-0.5)
            tr = median_time(ref, max(1, args.repeats // 2))
            row.update({"torch_ref_ms": round(tr * 1e3, 3),
                        "speedup_vs_torch": round(tr / tk, 1)})
        return row

    try:
        dtypes = [kv_dtype(name) for name in args.dtypes.split(",")]
    except ValueError as e:
        ap.error(str(e))
    for dtype in dtypes:
        for b in (int(x) for x in args.batches.split(",")):
            for ctx in (int(x) for x in args.contexts.split(",")):
                rows.append(measure(b, ctx, hq, hkv, d, bs, dtype, True))
    grid = []
    if args.grid:
        shapes = [(dtype, group, hd, gbs) for dtype in dtypes for group in grid_groups
                  for hd in (64, 80, 96, 128) for gbs in (16, 32, 64)]
        passes: dict[tuple, list[dict]] = {shape: [] for shape in shapes}
        for _ in range(args.grid_passes):  # whole passes: a row's samples minutes apart
            for dtype, group, hd, gbs in shapes:
                ctx = grid_context(grid_min_kv, 32, 8, hd, dtype.itemsize, gbs)
                passes[(dtype, group, hd, gbs)].append(
                    measure(32, ctx, 8 * group, 8, hd, gbs, dtype, False))
        for (_, group, hd, gbs), samples in passes.items():
            grid.append({"group": group, "head_dim": hd, "block_size": gbs,
                         **median_pass(samples)})
    big = [r for r in rows if r["tokens"] >= 32768]
    dram = statistics.median(bw_samples)
    for r in rows + grid:
        r["in_cache_fraction"] = round(r["in_cache_gb_per_s"] * 1e9 / dram, 3)
        if "fma_bound_gb_per_s" in r:
            r["fma_bound_fraction"] = round(min(1.0, r["fma_bound_gb_per_s"] * 1e9 / dram), 3)
    emit({
        "bench": "cpu_attention", "isa": cpu.resolve_isa(args.isa), "threads": threads,
        "dram_read_gb_per_s": round(dram / 1e9, 1),
        "fma_per_core_per_s": round(fma_per_s) if fma_per_s else None,
        "fma_lanes": lanes,
        "shape": {"Hq": hq, "Hkv": hkv, "D": d, "block_size": bs},
        "llc_bytes": llc, "stream_bytes": sbytes,
        "min_fraction_of_dram_bw_at_32k_tokens": min(r["fraction_of_dram_bw"] for r in big)
        if big else None,
        # the rows whose K and V are twice the last-level cache: DRAM reads for certain
        "min_fraction_of_dram_bw_past_llc": min((r["fraction_of_dram_bw"] for r in rows
                                                 if llc and r["kv_bytes"] >= 2 * llc),
                                                default=None),
        "min_speedup_vs_torch": min((r["speedup_vs_torch"] for r in rows
                                     if "speedup_vs_torch" in r), default=None),
        "results": rows,
        **({"min_fraction_of_dram_bw_grid": min(r["fraction_of_dram_bw"] for r in grid),
            "min_in_cache_fraction_grid": min(r["in_cache_fraction"] for r in grid),
            # rows below 0.70 from DRAM whose kernel, reading from cache, reaches 0.70: there
            # the loss is the overlap of reads and compute, elsewhere the compute itself
            "grid_below_goal_compute_bound": sum(
                r["fraction_of_dram_bw"] < 0.70 and r["in_cache_fraction"] < 0.70
                for r in grid),
            "grid_below_goal_overlap_bound": sum(
                r["fraction_of_dram_bw"] < 0.70 <= r["in_cache_fraction"] for r in grid),
            "min_fma_bound_fraction_grid": min((r["fma_bound_fraction"] for r in grid
                                                if "fma_bound_fraction" in r), default=None),
            "grid_min_kv_bytes": grid_min_kv, "grid": grid} if grid else {}),
    }, args.json)


if __name__ == "__main__":
    main()
