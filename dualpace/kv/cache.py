"""KV cache tensors in the HND layout: per layer K and V of [num_blocks, Hkv, block_size, D].

HND keeps one head's tokens of a block contiguous, which is what both the CPU paged-attention
kernel (cext) and FlashInfer's HND paged decode read (paper §5).
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        num_kv_heads: int,
        block_size: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Write K/V of T tokens ([T, Hkv, D]) at flat slots [T] of one layer."""
        write_kv(self.k[layer], self.v[layer], k, v, slots)


def write_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    bs = k_cache.shape[2]
    blocks = torch.div(slots, bs, rounding_mode="floor")
    offsets = slots - blocks * bs
    # Advanced indices around a slice put the token dim first: [T, Hkv, D] matches k.
    k_cache[blocks, :, offsets] = k.to(k_cache.dtype)
    v_cache[blocks, :, offsets] = v.to(v_cache.dtype)
