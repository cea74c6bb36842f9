"""Decode tokens/s of the in-process model vs transformers vs the weight-streaming roofline.

    python bench/decode_throughput.py --json

For each batch size B: B prompts of --prompt-len tokens are prefilled, then --steps decode
steps are timed (batch build, all stages, sampling): greedy, or with --temperature T > 0
every row samples (seeded, the exponential race of sampling/sampler.py), as an OpenAI
client's default request does. transformers runs batched ``generate`` on the same weights
(sampling too when T > 0); its prefill time (measured with one new token) is subtracted.
A step has two floors (``step_floors``): streaming the weights (weight bytes over the
measured DRAM read bandwidth; a floor only where the weights are well past the last-level
cache, ``weight_bytes_over_llc`` >= 2; --past-llc makes such a model: the default 167 MB
one sits in a 300 MiB L3 and read at 1.8x it) and the projections' multiply-adds (B x the
projection weights' elements, at the path's measured vector-FMA rate on every thread's
core, ``fma_per_core_per_s``; tile products on the amx path are left out). The
roofline is the larger (``bound`` says which): at batch 32 of fp32 weights on a 2-core
Zen 4 the FMAs take 2.3-2.7x as long as the weight reads, and a memory-only roofline there
put the step at 0.23 of a speed no code could reach. ``overhead_ms_per_step`` is a step's
time beyond the roofline (attention, Python, sampling, and whatever of the two floors does
not overlap).
"""

from __future__ import annotations

import argparse

import torch
from common import (
    cpu_model,
    dram_read_bandwidth,
    emit,
    llama3_8b_model_dir,
    llc_bytes,
    median_time,
    past_llc_model_dir,
    reference_model_dir,
)

from dualpace.kernels import cpu as cpu_kernels
from dualpace.kv.block_pool import BlockPool, BlockTable
from dualpace.kv.cache import KVCache
from dualpace.model.batch import SeqChunk, build_forward_batch
from dualpace.model.config import load_model_config
from dualpace.model.stages import StagedModel
from dualpace.model.weights import iter_streamed_weights, load_weights
from dualpace.sampling.sampler import SamplingRow, sample


def step_floors(weight_bytes: int, projection_params: int, batch: int, dram_bw: float,
                fma_per_s: float | None, lanes: int | None, threads: int) -> dict:
    """A decode step's floors in seconds: ``memory``, streaming ``weight_bytes`` at
    ``dram_bw`` bytes/s; ``fma``, ``batch`` x ``projection_params`` (the weights of the
    projections that run as FMAs) multiply-adds as vector FMAs of ``lanes`` lanes at
    ``fma_per_s`` a core on ``threads`` cores (None without a rate: the scalar path);
    ``roofline``, the larger, and ``bound``, which."""
    memory = weight_bytes / dram_bw
    fma = (batch * projection_params / lanes / (fma_per_s * threads)
           if fma_per_s and lanes else None)
    if fma is not None and fma > memory:
        return {"memory": memory, "fma": fma, "roofline": fma, "bound": "fma"}
    return {"memory": memory, "fma": fma, "roofline": memory, "bound": "memory"}


def ours_tokens_per_s(model, cfg, batch: int, prompt_len: int, steps: int, repeats: int,
                      temperature: float = 0.0):
    bs = 16
    need = batch * -(-(prompt_len + steps + 1) // bs)
    pool = BlockPool(need, bs)
    kv = KVCache(cfg.num_layers, need, cfg.num_kv_heads, bs, cfg.head_dim, model.dtype)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=g).tolist()

    def rows(step: int) -> list[SamplingRow]:
        return [SamplingRow(temperature, 1.0, -1, seed, step) for seed in range(batch)]

    def run():
        tables = [BlockTable(pool) for _ in range(batch)]
        for t in tables:
            t.append(prompt_len)
        fb = build_forward_batch([SeqChunk(p, 0, t.blocks) for p, t in zip(prompts, tables)], bs)
        last = sample(model.forward(fb, kv), rows(0))
        import time

        t0 = time.perf_counter()
        for s in range(steps):
            chunks = []
            for t, tok in zip(tables, last):
                t.append(1)
                chunks.append(SeqChunk([tok], prompt_len + s, t.blocks))
            fb = build_forward_batch(chunks, bs)
            last = sample(model.forward(fb, kv), rows(s + 1))
        dt = time.perf_counter() - t0
        for t in tables:
            t.release()
        run.last = dt

    times = []
    run()
    for _ in range(repeats):
        run()
        times.append(run.last)
    times.sort()
    return batch * steps / times[len(times) // 2]


def hf_tokens_per_s(path, batch: int, prompt_len: int, steps: int, repeats: int,
                    temperature: float = 0.0, dtype: torch.dtype = torch.float32):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    hf.generation_config.eos_token_id = None
    ids = torch.randint(0, hf.config.vocab_size, (batch, prompt_len),
                        generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    sampling = ({"do_sample": True, "temperature": temperature, "top_k": None, "top_p": None}
                if temperature > 0 else {"do_sample": False})

    def gen(n):
        with torch.no_grad():
            hf.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                        pad_token_id=0, **sampling)

    t_prefill = median_time(lambda: gen(1), repeats)
    t_all = median_time(lambda: gen(steps + 1), repeats)
    return batch * steps / max(t_all - t_prefill, 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line")
    ap.add_argument("--model", help="checkpoint dir (default: the 55M llama.cpp-comparison model)")
    ap.add_argument("--past-llc", action="store_true",
                    help="a bench model of twice the last-level cache (hidden 1024, as many "
                         "layers as that takes; made once) instead of the 55M one, which a "
                         "large L3 holds")
    ap.add_argument("--llama3-8b-layers", type=int, default=0, metavar="N",
                    help="a bench model of N layers of Llama-3-8B's shape (hidden 4096, 32 / 8 "
                         "heads, intermediate 14336; made once): the 8B projections' shapes")
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers reference")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "auto"), default="float32",
                    help="compute dtype (weights and KV; transformers runs the same): auto is "
                         "the CPU worker's default, bfloat16 where the CPU has AMX")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0: greedy (default); > 0: every row samples at this temperature")
    args = ap.parse_args()
    if args.temperature < 0:
        ap.error(f"--temperature: must be >= 0, got {args.temperature}")

    llc = llc_bytes()
    if sum(map(bool, (args.past_llc, args.model, args.llama3_8b_layers))) > 1:
        ap.error("--model, --past-llc and --llama3-8b-layers: one at most")
    if args.llama3_8b_layers < 0:
        ap.error(f"--llama3-8b-layers: must be >= 1, got {args.llama3_8b_layers}")
    if args.past_llc and not llc:
        ap.error("--past-llc: this system reports no CPU cache sizes (sysfs)")
    if args.model:
        path = args.model
    elif args.past_llc:
        path = past_llc_model_dir(2 * llc)
    elif args.llama3_8b_layers:
        path = llama3_8b_model_dir(args.llama3_8b_layers)
    else:
        path = reference_model_dir()
    cfg = load_model_config(path)
    dtype_name = args.dtype
    if dtype_name == "auto":
        dtype_name = "bfloat16" if cpu_kernels.cpu_features()["amx_bf16"] else "float32"
    dtype = getattr(torch, dtype_name)
    weights = load_weights(path, cfg, dtype)
    streamed = list(iter_streamed_weights(weights))
    weight_bytes = sum(t.numel() * t.element_size() for t in streamed)
    projections = [t for t in streamed if t.dim() == 2]  # not the norms
    projection_params = sum(t.numel() for t in projections)
    model = StagedModel(cfg, weights, args.prompt_len + args.steps + 8)
    threads = cpu_kernels.num_threads()
    # the reference read past the cache too, or part of it comes from there
    bw = dram_read_bandwidth(threads, mib=max(512, 2 * (llc or 0) >> 20))
    isa = cpu_kernels.resolve_isa()
    try:
        fma_per_s, lanes = cpu_kernels.fma_rate(isa)
    except ValueError:  # the scalar path: no vector FMAs to measure
        fma_per_s, lanes = None, None
    results = []
    for b in (int(x) for x in args.batch_sizes.split(",")):
        ours = ours_tokens_per_s(model, cfg, b, args.prompt_len, args.steps, args.repeats,
                                 args.temperature)
        # tile products (the amx path's bf16 projections of enough rows) are no FMAs
        fma_params = sum(t.numel() for t in projections
                         if not cpu_kernels.linear_uses_amx(t.dtype, b, t.shape[1], isa=isa))
        floors = step_floors(weight_bytes, fma_params, b, bw, fma_per_s, lanes, threads)
        # A step makes b tokens: its time against the roofline's.
        step, roof_step = b / ours, floors["roofline"]
        row = {"batch": b, "ours_tokens_per_s": round(ours, 1),
               "roofline_tokens_per_s": round(b / roof_step, 1),
               "ours_vs_roofline": round(roof_step / step, 3), "bound": floors["bound"],
               "step_ms": round(step * 1e3, 2), "roofline_step_ms": round(roof_step * 1e3, 2),
               "weight_read_ms": round(floors["memory"] * 1e3, 2),
               "fma_ms": round(floors["fma"] * 1e3, 2) if floors["fma"] is not None else None,
               "overhead_ms_per_step": round((step - roof_step) * 1e3, 2)}
        if not args.no_hf:
            hf = hf_tokens_per_s(path, b, args.prompt_len, args.steps, args.repeats,
                                 args.temperature, dtype)
            row.update({"transformers_tokens_per_s": round(hf, 1),
                        "ours_vs_transformers": round(ours / hf, 2)})
        results.append(row)
    emit({
        "bench": "decode_throughput", "model": str(path),
        "params_m": round(weight_bytes / dtype.itemsize / 1e6, 1), "weight_bytes": weight_bytes,
        "dtype": dtype_name, "native_stages": model.why_native or "yes",
        "threads": threads, "torch_threads": torch.get_num_threads(),
        "dram_read_gb_per_s": round(bw / 1e9, 1), "cpu": cpu_model() or "?",
        "fma_per_core_per_s": round(fma_per_s) if fma_per_s else None, "fma_lanes": lanes,
        "projection_params": projection_params,
        "llc_bytes": llc,
        # below 2 the last-level cache holds much of the weights: no DRAM roofline
        "weight_bytes_over_llc": round(weight_bytes / llc, 2) if llc else None,
        "isa": isa, "prompt_len": args.prompt_len, "steps": args.steps,
        "temperature": args.temperature,
        "results": results,
    }, args.json)


if __name__ == "__main__":
    main()
