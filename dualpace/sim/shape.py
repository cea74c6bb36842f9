"""The sizes the cost models need from a checkpoint's config.json: parameters per stage,
bytes of weights and of KV per token (paper §2.1's partition: pre-layer, per layer QKV /
attention / post-attention, post-layer)."""

from __future__ import annotations

from dataclasses import dataclass

from dualpace.model.config import ModelConfig


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden: int
    q_size: int  # query heads x head_dim
    kv_size: int  # KV heads x head_dim
    intermediate: int
    vocab: int
    dtype_bytes: int = 2  # bf16 weights and KV

    @classmethod
    def of(cls, cfg: ModelConfig, dtype_bytes: int = 2) -> ModelShape:
        return cls(cfg.num_layers, cfg.hidden_size, cfg.num_heads * cfg.head_dim,
                   cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size, cfg.vocab_size,
                   dtype_bytes)

    @property
    def qkv_params(self) -> int:
        """One layer's QKV projection (the pre-attention stage)."""
        return self.hidden * (self.q_size + 2 * self.kv_size)

    @property
    def post_attn_params(self) -> int:
        """One layer's output projection and gated MLP (the post-attention stage)."""
        return self.q_size * self.hidden + 3 * self.hidden * self.intermediate

    @property
    def head_params(self) -> int:
        """The LM head (the post-layer stage's matmul)."""
        return self.vocab * self.hidden

    @property
    def layer_params(self) -> int:
        return self.qkv_params + self.post_attn_params

    @property
    def dense_params(self) -> int:
        """Parameters every decode token multiplies with (the embedding is a gather)."""
        return self.num_layers * self.layer_params + self.head_params

    @property
    def weight_bytes(self) -> int:
        return (self.dense_params + self.vocab * self.hidden) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.kv_size * self.dtype_bytes
