"""GPU-worker forward speed per attention backend, against the same run's rooflines (issue 12).

Random bf16 weights of a checkpoint's shape (default: Llama-3.1-8B's) on one device:
- decode: tokens/s at each batch x context, each sequence's KV in shuffled blocks, eager and
  (for backends that capture) replayed from a CUDA graph; against the HBM roofline: weight
  bytes + the batch's KV bytes per step, over this run's device-to-device copy bandwidth;
- prefill: tokens/s of one prompt of each length, against this run's bf16 matmul rate (the
  model's 2 x params x tokens FLOPs, attention excluded).

    python bench/gpu_decode.py --json [--backends flashinfer,triton,torch]
        [--batches 1,16,64,256]
        [--contexts 1024,8192] [--prefill 512,2048,8192]

Goals on an H200 for the 8B shape: batch-1 decode >= 70% of the roofline, batch-64 >= 60%,
prefill >= 50% of the matmul rate. ``--backends`` defaults to those that import: FlashInfer
(the ``gpu`` extra), Triton, and the torch reference. ``--device cpu --shape tiny`` runs the
same code on CPU
(torch backend; the numbers then say nothing about a GPU) to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

import torch
from common import REPO  # noqa: F401  (puts the repository on sys.path)

from dualpace.kv.cache import KVCache
from dualpace.model.batch import SeqChunk, build_forward_batch
from dualpace.model.config import ModelConfig, RopeConfig
from dualpace.model.stages import StagedModel
from dualpace.model.weights import LayerWeights, ModelWeights
from dualpace.resolved import GRAPH_BACKENDS
from dualpace.runtime.decode_graphs import DecodeGraphs, PaddedDecodeInputs

SHAPES = {  # hidden, intermediate, layers, heads, kv heads, head dim, vocab
    "llama-3.1-8b": (4096, 14336, 32, 32, 8, 128, 128256),
    "tiny": (256, 512, 2, 4, 2, 64, 1024),
}
BS = 16


def model_config(shape: str) -> ModelConfig:
    h, inter, layers, heads, kvh, d, vocab = SHAPES[shape]
    return ModelConfig("LlamaForCausalLM", vocab, h, inter, layers, heads, kvh, d, 1e-5,
                       RopeConfig(500000.0), 131072, False, False, False, False, (), None)


def random_weights(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> ModelWeights:
    def w(*shape):
        return (torch.randn(shape, device=device) * shape[-1] ** -0.5).to(dtype)

    h, q, kv = cfg.hidden_size, cfg.q_size, cfg.kv_size
    layers = [LayerWeights(torch.ones(h, dtype=dtype, device=device), w(q + 2 * kv, h), None,
                           None, None, w(h, q), None, torch.ones(h, dtype=dtype, device=device),
                           w(2 * cfg.intermediate_size, h), w(h, cfg.intermediate_size))
              for _ in range(cfg.num_layers)]
    return ModelWeights(w(cfg.vocab_size, h), layers, torch.ones(h, dtype=dtype, device=device),
                        w(cfg.vocab_size, h))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn`` (synchronized), after two warm-ups."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(device: torch.device, mib: int = 1024) -> float:
    """Bytes/s of a device-to-device copy (read + write, as a decode reads its bytes once)."""
    a = torch.empty(mib << 18, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    return 2 * a.numel() * 4 / timed(lambda: b.copy_(a), device, 5)


def matmul_rate(device: torch.device, dtype: torch.dtype, n: int = 8192) -> float:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return 2 * n ** 3 / timed(lambda: a @ b, device, 5)


def weight_bytes(cfg: ModelConfig, itemsize: int) -> int:
    h, q, kv, i = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * i
    return (cfg.num_layers * per_layer + cfg.vocab_size * h) * itemsize  # + the LM head


def decode_case(model, cfg, kv_cache, batch: int, context: int, graphs: bool,
                device: torch.device, repeats: int) -> float:
    """Seconds per decode step (the forward and the LM head; sampling excluded)."""
    nb = -(-(context + 1) // BS)
    ids = list(range(kv_cache.num_blocks - 1))  # the last block: the graphs' scratch
    random.Random(batch * 31 + context).shuffle(ids)
    chunks = [SeqChunk([1], context, ids[r * nb:(r + 1) * nb]) for r in range(batch)]
    fb = build_forward_batch(chunks, BS, device)
    if not graphs:
        return timed(lambda: model.forward(fb, kv_cache), device, repeats)
    inputs = PaddedDecodeInputs(batch, nb, kv_cache.num_blocks - 1, BS, device)
    g = DecodeGraphs(model, kv_cache, inputs, [batch], per_stage=False)
    g.capture()
    assert g.prepare(fb)

    def step():
        g.run_stage(0)
        model.post_layer(g.output(batch))

    return timed(step, device, repeats)


def default_backends() -> list[str]:
    """The backends that import here, FlashInfer first (auto's order)."""
    import importlib.util

    return [b for b in ("flashinfer", "triton") if importlib.util.find_spec(b)] + ["torch"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--backends", default=",".join(default_backends()))
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--contexts", default="1024,8192")
    ap.add_argument("--prefill", default="512,2048,8192")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cuda":
        # set_device wants an index: torch 2.11 refuses a bare "cuda" (seen on the H200)
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    cfg = model_config(args.shape)
    weights = random_weights(cfg, dtype, device)
    batches = [int(x) for x in args.batches.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    kv_bytes_token = 2 * cfg.num_layers * cfg.kv_size * dtype.itemsize
    block_bytes = kv_bytes_token * BS
    wanted = max(b * -(-(c + 1) // BS) for b in batches for c in contexts) + 1
    # A batch x context whose KV does not fit half the free memory is skipped, not attempted
    # (256 sequences x 8k tokens of an 8B model hold 268 GB).
    budget = (torch.cuda.mem_get_info(device)[0] // 2 if device.type == "cuda"
              else 8 << 30) // block_bytes
    blocks = min(wanted, budget)
    cuda = device.type == "cuda"  # the CPU smoke run measures with smaller operands
    bw = copy_bandwidth(device, 1024 if cuda else 256)
    flops = matmul_rate(device, dtype, 8192 if cuda else 1024)
    w_bytes = weight_bytes(cfg, dtype.itemsize)
    report = {"bench": "gpu_decode", "device": (torch.cuda.get_device_name(device)
                                                if device.type == "cuda" else "cpu"),
              "shape": args.shape, "dtype": str(dtype).removeprefix("torch."),
              "copy_bandwidth_gb_per_s": round(bw / 1e9, 1),
              "matmul_tflops": round(flops / 1e12, 1), "backends": {}}
    for backend in args.backends.split(","):
        model = StagedModel(cfg, weights, max(contexts) + max(int(x) for x in
                                                             args.prefill.split(",")) + 16,
                            attention_backend=backend, block_size=BS)
        kv = KVCache(cfg.num_layers, blocks, cfg.num_kv_heads, BS, cfg.head_dim, dtype, device)
        rows = []
        for c in contexts:
            for b in batches:
                modes = [False] + ([True] if backend in GRAPH_BACKENDS
                                   and device.type == "cuda" else [])
                if b * -(-(c + 1) // BS) + 1 > blocks:
                    rows.append({"batch": b, "context": c, "skipped": "KV does not fit"})
                    continue
                for graphs in modes:
                    t = decode_case(model, cfg, kv, b, c, graphs, device, args.repeats)
                    roof = (w_bytes + b * (c + 1) * kv_bytes_token) / bw
                    rows.append({"batch": b, "context": c, "cuda_graph": graphs,
                                 "step_ms": round(t * 1e3, 3),
                                 "tokens_per_s": round(b / t, 1),
                                 "fraction_of_roofline": round(roof / t, 3)})
        pre = []
        for n in (int(x) for x in args.prefill.split(",")):
            pk = KVCache(cfg.num_layers, -(-n // BS), cfg.num_kv_heads, BS, cfg.head_dim,
                         dtype, device)
            fb = build_forward_batch([SeqChunk([1] * n, 0, list(range(-(-n // BS))))], BS,
                                     device)
            t = timed(lambda fb=fb, pk=pk, m=model: m.forward(fb, pk), device, args.repeats)
            useful = 2 * (w_bytes / dtype.itemsize) * n
            pre.append({"tokens": n, "ms": round(t * 1e3, 2), "tokens_per_s": round(n / t),
                        "fraction_of_matmul_rate": round(useful / t / flops, 3)})
        del kv
        report["backends"][backend] = {"decode": rows, "prefill": pre}
    print(json.dumps(report) if args.json else json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
