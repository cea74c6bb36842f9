"""A deterministic, random-weight Llama-architecture checkpoint in Hugging Face format.

Its text is meaningless: it exists so that the server, tests and benchmarks run on a machine
without downloaded weights. Same arguments, same bytes (fixed seed, fixed tokenizer).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)

LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)


@dataclass(frozen=True)
class DemoSpec:
    hidden_size: int = 512
    num_layers: int = 8
    num_heads: int = 8
    num_kv_heads: int = 4
    intermediate_size: int = 1536
    max_position_embeddings: int = 4096
    seed: int = 0
    # Extra vocabulary rows beyond the byte-level tokenizer (never produced by it); benches
    # use it to match the LM-head size of a reference model.
    extra_vocab: int = 0


def default_demo_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dualpace" / "demo-model-v1"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1))
    bs += list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def build_byte_tokenizer() -> Tokenizer:
    """256 byte tokens (id = byte value) + Llama-3-style special tokens, BOS prepended."""
    vocab = {ch: b for b, ch in sorted(_bytes_to_unicode().items())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    bos = SPECIAL_TOKENS[0]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, 256)]
    )
    return tok


def random_llama_weights(spec: DemoSpec, vocab: int) -> dict[str, torch.Tensor]:
    """Seeded random Llama weights in Hugging Face names (also used by bench/peers)."""
    g = torch.Generator().manual_seed(spec.seed)
    H, I = spec.hidden_size, spec.intermediate_size  # noqa: E741
    D = H // spec.num_heads
    kv = spec.num_kv_heads * D

    def lin(rows: int, cols: int) -> torch.Tensor:
        # std 1/sqrt(fan_in): activations keep unit scale, logits get clear top-2 margins.
        return torch.randn(rows, cols, generator=g) / cols**0.5

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    w = {"model.embed_tokens.weight": torch.randn(vocab, H, generator=g)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "self_attn.q_proj.weight"] = lin(H, H)
        w[p + "self_attn.k_proj.weight"] = lin(kv, H)
        w[p + "self_attn.v_proj.weight"] = lin(kv, H)
        w[p + "self_attn.o_proj.weight"] = lin(H, H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        w[p + "mlp.gate_proj.weight"] = lin(I, H)
        w[p + "mlp.up_proj.weight"] = lin(I, H)
        w[p + "mlp.down_proj.weight"] = lin(H, I)
    w["model.norm.weight"] = norm(H)
    w["lm_head.weight"] = lin(vocab, H) * 4.0
    return w


def llama_config(spec: DemoSpec, vocab: int, bos: int, eos: int | list[int],
                 rope_theta: float, rope_scaling: dict | None = None) -> dict:
    """config.json of a random Llama of ``spec`` (also used by bench/peers)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.hidden_size // spec.num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": rope_theta,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "float32",
        "dualpace_demo": asdict(spec),
    }
    if rope_scaling:
        config["rope_scaling"] = rope_scaling
    return config


def make_demo_model(out_dir: str | Path, spec: DemoSpec = DemoSpec()) -> Path:
    """Write the checkpoint to ``out_dir`` (created); returns the directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_byte_tokenizer()
    vocab = tok.get_vocab_size(with_added_tokens=True) + spec.extra_vocab
    bos, eos, eot = 256, 257, 260
    config = llama_config(spec, vocab, bos, [eos, eot], rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 1024,
    })
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": bos, "eos_token_id": [eos, eot]}, indent=2)
    )
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": SPECIAL_TOKENS[0],
        "eos_token": SPECIAL_TOKENS[4],
        "chat_template": LLAMA3_CHAT_TEMPLATE,
        "model_max_length": spec.max_position_embeddings,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }, indent=2))
    tmp = out / "model.safetensors.tmp"
    save_file(random_llama_weights(spec, vocab), str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "model.safetensors")  # last: a complete file marks a complete model
    return out


def ensure_demo_model(path: Path | None = None) -> Path:
    """The demo model's directory, created on first use."""
    path = path or default_demo_dir()
    if not (path / "model.safetensors").is_file():
        make_demo_model(path)
    return path
