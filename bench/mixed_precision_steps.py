"""A bf16 (or fp16) model's steps past decode size on CPU, through each route its stages can
take, against the same model in fp32.

    python bench/mixed_precision_steps.py --json

Two steps of the in-process model (default: the demo model), each timed as a whole forward
(embedding, every layer, the head): a prefill of one --prompt-len prompt, and a decode step
of --decode-rows sequences with --context tokens each, past NATIVE_MAX_ROWS so the fused
decode step does not take it. A mixed-precision model's stages over more than
NATIVE_MAX_ROWS rows (native_stages.py) take one of three routes:

- ``torch``: the torch stages in the model's dtype (where the CPU has that dtype's
  arithmetic: oneDNN's bf16 GEMMs, AMX on Sapphire Rapids);
- ``sliced``: the decode-sized C stages NATIVE_MAX_ROWS rows a call;
- ``gemm``: the chunk stages on the cext GEMM, which widens W a tile at a time.

The route this CPU takes unpatched is ``default_route``. Each (step, route) and the fp32
model's step are timed in turns (common.turns), so all meet the same state of a shared
host; ``vs_fp32`` is the median of the per-turn ratios. torch's OpenMP threads spin as
long as the workers' do (runtime/supervisor.py's OMP_SPIN_COUNT, unless GOMP_SPINCOUNT is
set): libgomp's default ~4 ms spin after each torch op (a bf16 model converts its
activations at every stage boundary) lands on the cores of the next C call, and once made
these steps 2-2.6x slower in-process than the workers ran them.
"""

from __future__ import annotations

import os

os.environ.setdefault("GOMP_SPINCOUNT", "3000")  # before torch loads libgomp

import argparse
import statistics

import torch
from common import cpu_model, emit, turns

from dualpace.demo_model import ensure_demo_model
from dualpace.kernels import cpu as cpu_kernels
from dualpace.kv.cache import KVCache
from dualpace.model.batch import SeqChunk, build_forward_batch
from dualpace.model.config import load_model_config
from dualpace.model.native_stages import NATIVE_MAX_ROWS
from dualpace.model.stages import StagedModel
from dualpace.model.weights import load_weights

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
ROUTES = ("torch", "sliced", "gemm")


def set_route(model: StagedModel, route: str, gemm_path: str | None) -> None:
    """Patch the mixed model's NativeStages so its rows past decode size take ``route``."""
    native = model.native
    native.slices_rows = route != "torch"
    native.gemm_isa = gemm_path if route == "gemm" else None


def default_route(model: StagedModel) -> str:
    native = model.native
    if not native.slices_rows:
        return "torch"
    return "gemm" if native.gemm_isa is not None else "sliced"


def steps(cfg, dtype: torch.dtype, prompt_len: int, rows: int, context: int, bs: int = 16):
    """(prefill batch, decode batch, KV cache) for the two steps; the decode rows' earlier
    context is whatever the cache holds (its values do not change the time)."""
    vocab = cfg.vocab_size
    per_seq = -(-(context + 1) // bs)
    prefill_blocks = -(-prompt_len // bs)
    cache = KVCache(cfg.num_layers, 1 + prefill_blocks + rows * per_seq, cfg.num_kv_heads,
                    bs, cfg.head_dim, dtype)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (prompt_len,), generator=g).tolist()
    prefill = build_forward_batch([SeqChunk(prompt, 0, list(range(1, 1 + prefill_blocks)))],
                                  bs)
    first = 1 + prefill_blocks
    decode = build_forward_batch(
        [SeqChunk([int(t)], context, list(range(first + i * per_seq, first + (i + 1) * per_seq)))
         for i, t in enumerate(torch.randint(0, vocab, (rows,), generator=g))], bs)
    return prefill, decode, cache


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--model", help="checkpoint dir (default: the demo model)")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--decode-rows", type=int, default=200)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.decode_rows <= NATIVE_MAX_ROWS or args.prompt_len <= NATIVE_MAX_ROWS:
        ap.error(f"--decode-rows and --prompt-len: more than NATIVE_MAX_ROWS "
                 f"({NATIVE_MAX_ROWS}) rows, or the routes do not differ")
    if not cpu_kernels.available():
        ap.error("the C kernels are not built (make install)")
    model_dir = args.model or ensure_demo_model()
    cfg = load_model_config(model_dir)
    dtype = DTYPES[args.dtype]
    max_len = max(args.prompt_len, args.context + 1) + 16
    mixed = StagedModel(cfg, load_weights(model_dir, cfg, dtype), max_len)
    exact = StagedModel(cfg, load_weights(model_dir, cfg, torch.float32), max_len)
    if mixed.native is None or exact.native is None:
        ap.error(f"no native stages for this model: {mixed.why_native or exact.why_native}")
    gemm_path = cpu_kernels.resolve_isa()
    routes = [r for r in ROUTES if r != "gemm" or gemm_path in cpu_kernels.GEMM_ISAS]
    default = default_route(mixed)
    batches = {d: steps(cfg, d, args.prompt_len, args.decode_rows, args.context)
               for d in (dtype, torch.float32)}
    torch.set_num_threads(cpu_kernels.num_threads())
    out = {"bench": "mixed_precision_steps", "model": str(model_dir), "dtype": args.dtype,
           "cpu": cpu_model(), "path": gemm_path, "threads": cpu_kernels.num_threads(),
           "gomp_spincount": os.environ["GOMP_SPINCOUNT"], "default_route": default,
           "steps": {}}
    for step, index, rows in (("prefill", 0, args.prompt_len),
                              ("decode", 1, args.decode_rows)):

        def run(model, route, d, index=index):
            if route is not None:
                set_route(model, route, gemm_path)
            batch, cache = batches[d][index], batches[d][2]
            with torch.inference_mode():
                model.forward(batch, cache)

        fns = [lambda: run(exact, None, torch.float32)]
        fns += [lambda r=r: run(mixed, r, dtype) for r in routes]
        fp32, *times = turns(fns, args.repeats)
        res = {"rows": rows, "fp32_ms": round(statistics.median(fp32) * 1e3, 2), "routes": {}}
        for r, ts in zip(routes, times):
            res["routes"][r] = {
                "ms": round(statistics.median(ts) * 1e3, 2),
                "vs_fp32": round(statistics.median(t / f for t, f in zip(ts, fp32)), 2)}
        out["steps"][step] = res
    emit(out, args.json)


if __name__ == "__main__":
    main()
