"""Shared fixtures: tiny random-weight checkpoints written by transformers itself."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from dualpace.demo_model import LLAMA3_CHAT_TEMPLATE, SPECIAL_TOKENS, build_byte_tokenizer

# CI runs the property tests on a fixed set of examples (no flaky failures from a new draw);
# a developer's run explores new ones.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

VOCAB = 261  # the byte tokenizer: 256 bytes + 5 special tokens


def write_tokenizer(path: Path) -> None:
    build_byte_tokenizer().save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": SPECIAL_TOKENS[0], "eos_token": SPECIAL_TOKENS[4],
        "chat_template": LLAMA3_CHAT_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast",
    }))


def _reinit(model: torch.nn.Module, seed: int) -> None:
    """Weights with clear top-2 logit margins (transformers' std 0.02 gives near-uniform
    logits, where a float-noise difference could flip a greedy choice)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
        head = model.lm_head.weight
        if head is not model.model.embed_tokens.weight:
            head.mul_(4.0)


def _llama(path: Path):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
        bos_token_id=256, eos_token_id=[257, 260],
    )
    return LlamaForCausalLM(cfg)


def _qwen3(path: Path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=192, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=1, head_dim=32, max_position_embeddings=2048,
        tie_word_embeddings=True, rope_theta=1000000.0, bos_token_id=256, eos_token_id=257,
    )
    return Qwen3ForCausalLM(cfg)


def _qwen2(path: Path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
        tie_word_embeddings=False, rope_theta=1000000.0, bos_token_id=256, eos_token_id=257,
    )
    return Qwen2ForCausalLM(cfg)


BUILDERS = {"llama": _llama, "qwen3": _qwen3, "qwen2": _qwen2}


def build_checkpoint(kind: str, path: Path, seed: int = 0):
    torch.manual_seed(seed)
    model = BUILDERS[kind](path).float().eval()
    _reinit(model, seed)
    model.save_pretrained(str(path), safe_serialization=True)
    write_tokenizer(path)
    return model


@pytest.fixture(scope="session", params=sorted(BUILDERS))
def hf_checkpoint(request, tmp_path_factory):
    """(kind, checkpoint dir, the transformers model holding the same weights)."""
    path = tmp_path_factory.mktemp(f"ckpt-{request.param}")
    model = build_checkpoint(request.param, path)
    return request.param, path, model


@pytest.fixture(scope="session")
def llama_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt-llama-only")
    model = build_checkpoint("llama", path)
    return path, model


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy continuation of ``prompt`` (exactly n tokens, EOS not special)."""
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        ids = torch.tensor([prompt])
        # An explicit mask: otherwise a prompt token equal to pad_token_id is masked out.
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
    return out[0, len(prompt):].tolist()
