"""How many KV blocks the GPU pool gets, sized the way vLLM sizes it (issue 11).

After the weights are loaded, one profiling forward at the batched-token limit (and the LM
head over ``max_num_seqs`` rows) measures the peak of torch's allocations; the device's
``mem_get_info`` gives what everything else holds (the CUDA context, NCCL, other processes).
The instance may use ``--gpu-memory-utilization`` of the device's memory; the KV pool gets
what the weights, the peak activations and the rest leave of that:

    non_torch = (total - free) - torch_reserved
    kv_bytes  = total * utilization - torch_peak - non_torch

``--gpu-kv-blocks`` still wins; a CPU "GPU" keeps the fixed 512 MiB default (resolved.py).
"""

from __future__ import annotations

import logging

import torch

from dualpace.model.batch import SeqChunk, build_forward_batch

log = logging.getLogger("dualpace.runtime")


def kv_blocks_for_memory(total: int, free: int, torch_peak: int, torch_reserved: int,
                         utilization: float, block_bytes: int) -> int:
    """The formula of the module docstring, in bytes; raises ValueError with the figures when
    nothing is left for KV."""
    non_torch = max(0, (total - free) - torch_reserved)
    kv_bytes = int(total * utilization) - torch_peak - non_torch
    blocks = kv_bytes // block_bytes
    if blocks < 1:
        gib = 1 << 30
        raise ValueError(
            f"no GPU memory left for the KV cache: {utilization:.2f} x {total / gib:.1f} GiB "
            f"allowed, the model's peak is {torch_peak / gib:.2f} GiB and "
            f"{non_torch / gib:.2f} GiB is held outside torch (CUDA context, other "
            f"processes); raise --gpu-memory-utilization, lower --max-num-batched-tokens or "
            f"--max-num-seqs, or set --gpu-kv-blocks")
    return blocks


def profile_forward(model, staging, num_tokens: int, num_rows: int, max_len: int) -> None:
    """The largest step the engine may send: ``num_tokens`` prompt tokens (sequences of at
    most ``max_len``) through every layer, their KV written into the staging area, and the
    LM head over ``num_rows`` rows."""
    bs = staging.block_size
    chunks, nxt, left = [], 0, num_tokens
    while left > 0:
        n = min(left, max_len)
        nb = -(-n // bs)
        if nxt + nb > staging.num_blocks:
            break
        chunks.append(SeqChunk([0] * n, 0, list(range(nxt, nxt + nb))))
        nxt, left = nxt + nb, left - n
    fb = build_forward_batch(chunks, bs, model.device)
    with torch.inference_mode():
        hidden = model.pre_layer(fb.input_ids)
        for i in range(model.cfg.num_layers):
            hidden = model.layer(i, hidden, fb, staging)
        model.post_layer(hidden[:1].expand(num_rows, -1).contiguous())


def size_gpu_kv(model, staging, num_tokens: int, num_rows: int, max_len: int,
                utilization: float, block_bytes: int) -> int:
    """KV blocks for a CUDA GPU worker (after the weights and the staging area exist)."""
    dev = model.device
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    profile_forward(model, staging, num_tokens, num_rows, max_len)
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(dev)
    reserved = torch.cuda.memory_reserved(dev)
    blocks = kv_blocks_for_memory(total, free, peak, reserved, utilization, block_bytes)
    gib = 1 << 30
    log.warning("GPU KV cache on %s: %d blocks (%.2f GiB); %.0f%% of %.1f GiB, model peak "
                "%.2f GiB", dev, blocks, blocks * block_bytes / gib, utilization * 100,
                total / gib, peak / gib)
    return blocks
