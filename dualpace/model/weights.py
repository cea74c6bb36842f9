"""Model weights as the stage functions consume them, and their loading from safetensors.

Projections are fused at load time (Fig. 2: "Packed QKV Linear", "Packed Gate/Up") so each
dense stage issues one GEMM per projection group. Tensors are read one at a time from the
memory-mapped files and converted to the compute dtype, so at most one tensor beyond the
final weights is ever resident.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from dualpace.errors import CheckpointError
from dualpace.model.config import ModelConfig

_STORED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [q_size + 2 * kv_size, H]
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # [head_dim] (Qwen3)
    k_norm: torch.Tensor | None
    o: torch.Tensor  # [H, q_size]
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2 * I, H]
    down: torch.Tensor  # [H, I]


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H]; the same tensor as embed when tied


class _TensorSource:
    """Name -> tensor over one or several safetensors files, opened lazily (mmap)."""

    def __init__(self, model_dir: Path, stack: ExitStack):
        self._dir = model_dir
        self._stack = stack
        self._handles: dict[str, object] = {}
        self._where = self._index(model_dir)

    @staticmethod
    def _index(model_dir: Path) -> dict[str, str]:
        index = model_dir / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index}: malformed index ({e})") from e
            return dict(weight_map)
        single = model_dir / "model.safetensors"
        if not single.is_file():
            raise CheckpointError(
                f"{model_dir}: neither model.safetensors nor model.safetensors.index.json found"
            )
        return {name: single.name for name in _open(single, None)}

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str, shape: tuple[int, ...], part: Part | None
            ) -> tuple[torch.Tensor, Path]:
        """The tensor (or the rows/columns ``part`` of it, read without the rest), checked
        against its expected full ``shape``."""
        if name not in self._where:
            raise CheckpointError(f"{self._dir}: missing tensor {name!r}")
        fname = self._where[name]
        path = self._dir / fname
        if fname not in self._handles:
            self._handles[fname] = _open(path, self._stack)
        try:
            view = self._handles[fname].get_slice(name)
            stored = tuple(view.get_shape())
            if stored != tuple(shape):
                raise CheckpointError(
                    f"{path}: tensor {name!r} has shape {stored}, expected {tuple(shape)}")
            if part is None:
                tensor = view[:]
            elif part.dim == 0:
                tensor = view[part.start:part.stop]
            else:
                tensor = view[:, part.start:part.stop]
        except CheckpointError:
            raise
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{path}: cannot read tensor {name!r} ({e})") from e
        return tensor, path


def _open(path: Path, stack: ExitStack | None):
    if not path.is_file():
        raise CheckpointError(f"{path}: file listed in the index does not exist")
    try:
        handle = safe_open(str(path), framework="pt", device="cpu")
    except Exception as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e
    if stack is None:
        with handle as h:
            return list(h.keys())
    return stack.enter_context(handle)


@dataclass(frozen=True)
class Part:
    """Rows (dim 0) or columns (dim 1) [start, stop) of a tensor: one tensor-parallel shard."""

    dim: int
    start: int
    stop: int


@dataclass(frozen=True)
class Shard:
    rank: int = 0
    size: int = 1

    def part(self, dim: int, full: int) -> Part | None:
        if self.size == 1:
            return None
        n = full // self.size
        return Part(dim, self.rank * n, (self.rank + 1) * n)


class WeightLoader:
    """Reads, checks and converts checkpoint tensors; errors name the file and tensor."""

    def __init__(self, source: _TensorSource, dtype: torch.dtype, device: torch.device):
        self.source = source
        self.dtype = dtype
        self.device = device

    def load(self, name: str, shape: tuple[int, ...], part: Part | None = None) -> torch.Tensor:
        tensor, path = self.source.get(name, shape, part)
        if tensor.dtype not in _STORED_DTYPES:
            raise CheckpointError(
                f"{path}: tensor {name!r} is stored as {tensor.dtype}; "
                "supported: float32, float16, bfloat16"
            )
        return tensor.to(device=self.device, dtype=self.dtype).contiguous()

    def load_cat(self, parts: list[tuple[str, tuple[int, ...], Part | None]]) -> torch.Tensor:
        return torch.cat([self.load(n, s, p) for n, s, p in parts], dim=0)


def _layer(cfg: ModelConfig, w: WeightLoader, i: int, shard: Shard) -> LayerWeights:
    """One layer's weights; under tensor parallelism this rank's heads and MLP columns
    (column-parallel QKV and gate/up, row-parallel O and down)."""
    p = f"model.layers.{i}."
    H, D, I = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size  # noqa: E741
    qkv = [(p + "self_attn.q_proj", cfg.q_size), (p + "self_attn.k_proj", cfg.kv_size),
           (p + "self_attn.v_proj", cfg.kv_size)]
    mlp_in = [(p + "mlp.gate_proj.weight", I), (p + "mlp.up_proj.weight", I)]
    return LayerWeights(
        input_norm=w.load(p + "input_layernorm.weight", (H,)),
        qkv=w.load_cat([(n + ".weight", (r, H), shard.part(0, r)) for n, r in qkv]),
        qkv_bias=w.load_cat([(n + ".bias", (r,), shard.part(0, r)) for n, r in qkv])
        if cfg.qkv_bias
        else None,
        q_norm=w.load(p + "self_attn.q_norm.weight", (D,)) if cfg.qk_norm else None,
        k_norm=w.load(p + "self_attn.k_norm.weight", (D,)) if cfg.qk_norm else None,
        o=w.load(p + "self_attn.o_proj.weight", (H, cfg.q_size), shard.part(1, cfg.q_size)),
        o_bias=w.load(p + "self_attn.o_proj.bias", (H,)) if cfg.o_bias else None,
        post_norm=w.load(p + "post_attention_layernorm.weight", (H,)),
        gate_up=w.load_cat([(n, (I, H), shard.part(0, I)) for n, _ in mlp_in]),
        down=w.load(p + "mlp.down_proj.weight", (H, I), shard.part(1, I)),
    )


def load_weights(
    model_dir: str | Path, cfg: ModelConfig, dtype: torch.dtype, device: torch.device | str = "cpu",
    shard: Shard = Shard(),
) -> ModelWeights:
    """Load a checkpoint's weights into fused, compute-dtype tensors on ``device``.

    ``cfg`` is the checkpoint's (unsharded) config; with ``shard`` only this rank's part of
    every split tensor is read. Embedding, norms and LM head are replicated."""
    model_dir = Path(model_dir)
    cfg.shard(shard.size)  # checks divisibility
    with ExitStack() as stack:
        loader = WeightLoader(_TensorSource(model_dir, stack), dtype, torch.device(device))
        V, H = cfg.vocab_size, cfg.hidden_size
        embed = loader.load("model.embed_tokens.weight", (V, H))
        layers = [_layer(cfg, loader, i, shard) for i in range(cfg.num_layers)]
        final_norm = loader.load("model.norm.weight", (H,))
        if loader.source.has("lm_head.weight") and not cfg.tie_word_embeddings:
            lm_head = loader.load("lm_head.weight", (V, H))
        elif cfg.tie_word_embeddings:
            lm_head = embed
        else:
            raise CheckpointError(
                f"{model_dir}: missing tensor 'lm_head.weight' (tie_word_embeddings is false)"
            )
    return ModelWeights(embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head)


def iter_streamed_weights(weights: ModelWeights) -> Iterator[torch.Tensor]:
    """Every distinct weight tensor a decode step streams: all but the embedding table, of
    which a step reads only its tokens' rows, unless it is tied to the LM head (then it is
    the LM head, read whole)."""
    seen: set[int] = set()
    tensors = [weights.final_norm, weights.lm_head]  # tied: lm_head is the embedding
    for layer in weights.layers:
        tensors += [t for t in vars(layer).values() if t is not None]
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            yield t


def iter_weight_bytes(weights: ModelWeights) -> Iterator[int]:
    """Bytes of each tensor a decode step streams (``iter_streamed_weights``): the
    weight-streaming roofline's numerator."""
    for t in iter_streamed_weights(weights):
        yield t.numel() * t.element_size()
