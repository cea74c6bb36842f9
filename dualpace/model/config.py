"""Model configuration read from a Hugging Face checkpoint's ``config.json``.

Both config styles seen in the wild are accepted: ``rope_theta`` + ``rope_scaling`` (Llama-3.1
checkpoints, transformers < 5) and ``rope_parameters`` (transformers >= 5).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from dualpace.errors import CheckpointError

# architecture name -> (QKV always biased, per-head q/k RMSNorm)
SUPPORTED_ARCHITECTURES: dict[str, tuple[bool, bool]] = {
    "LlamaForCausalLM": (False, False),
    "MistralForCausalLM": (False, False),
    "Qwen2ForCausalLM": (True, False),  # Qwen2/2.5: q/k/v biased, o_proj not
    "Qwen3ForCausalLM": (False, True),
}
SUPPORTED_ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    def shard(self, tp: int) -> ModelConfig:
        """The per-rank view under ``tp``-way tensor parallelism: attention heads (query and
        KV) and the MLP's intermediate dimension are split; hidden size is not."""
        if tp == 1:
            return self
        for name, n in (("num_attention_heads", self.num_heads),
                        ("num_key_value_heads", self.num_kv_heads),
                        ("intermediate_size", self.intermediate_size)):
            if n % tp:
                raise ValueError(f"tensor parallelism {tp} does not divide {name}={n}")
        return dataclasses.replace(self, num_heads=self.num_heads // tp,
                                   num_kv_heads=self.num_kv_heads // tp,
                                   intermediate_size=self.intermediate_size // tp)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _as_id_tuple(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _parse_rope(cfg: dict, path: Path) -> RopeConfig:
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        params = params["full_attention"]  # per-layer-type form; all layers are full here
    if params is None:
        params = dict(cfg.get("rope_scaling") or {})
        params.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(
            f"{path}: unsupported rope type {rope_type!r} (supported: "
            f"{', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    if rope_type == "default":
        return RopeConfig(theta=theta)
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params["factor"]),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )


def _require(cfg: dict, key: str, path: Path):
    if key not in cfg:
        raise CheckpointError(f"{path}: missing field {key!r}")
    return cfg[key]


def load_model_config(model_dir: str | Path) -> ModelConfig:
    """Parse ``config.json`` (and ``generation_config.json`` for EOS ids) of a checkpoint."""
    model_dir = Path(model_dir)
    path = model_dir / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{model_dir}: no config.json (is this a Hugging Face checkpoint?)")
    cfg = _read_json(path)
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise CheckpointError(
            f"{path}: unsupported architectures {archs!r}; supported: "
            f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
    if cfg.get("use_sliding_window"):
        raise CheckpointError(f"{path}: sliding-window attention is not supported")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{path}: unsupported hidden_act {act!r} (supported: silu)")
    qkv_always_biased, qk_norm = SUPPORTED_ARCHITECTURES[arch]
    attention_bias = bool(cfg.get("attention_bias", False))
    if cfg.get("mlp_bias"):
        raise CheckpointError(f"{path}: mlp_bias=true is not supported")
    hidden = int(_require(cfg, "hidden_size", path))
    heads = int(_require(cfg, "num_attention_heads", path))
    head_dim = cfg.get("head_dim") or hidden // heads
    eos = _as_id_tuple(cfg.get("eos_token_id"))
    gen_path = model_dir / "generation_config.json"
    if gen_path.is_file():
        gen_eos = _as_id_tuple(_read_json(gen_path).get("eos_token_id"))
        eos = tuple(dict.fromkeys(gen_eos + eos))
    return ModelConfig(
        architecture=arch,
        vocab_size=int(_require(cfg, "vocab_size", path)),
        hidden_size=hidden,
        intermediate_size=int(_require(cfg, "intermediate_size", path)),
        num_layers=int(_require(cfg, "num_hidden_layers", path)),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope=_parse_rope(cfg, path),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=qkv_always_biased or attention_bias,
        o_bias=attention_bias and not qkv_always_biased,
        qk_norm=qk_norm,
        eos_token_ids=eos,
        bos_token_id=cfg.get("bos_token_id"),
    )
