"""config.json in both rope styles, sharded weights, and one clear error per bad checkpoint."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from dualpace.errors import CheckpointError
from dualpace.model.config import load_model_config
from dualpace.model.weights import iter_weight_bytes, load_weights


@pytest.fixture
def ckpt(llama_checkpoint, tmp_path):
    path, _ = llama_checkpoint
    out = tmp_path / "ckpt"
    shutil.copytree(path, out)
    return out


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))


def test_transformers5_rope_parameters(ckpt):
    cfg = load_model_config(ckpt)
    written = json.loads((ckpt / "config.json").read_text())
    assert "rope_parameters" in written  # transformers >= 5 writes this style
    assert cfg.rope.rope_type == "llama3" and cfg.rope.factor == 8.0
    assert cfg.rope.theta == 500000.0 and cfg.rope.original_max_position_embeddings == 256
    assert cfg.num_kv_heads == 2 and cfg.head_dim == 32 and cfg.eos_token_ids == (257, 260)


def test_legacy_rope_theta_and_rope_scaling_give_the_same_config(ckpt):
    new_style = load_model_config(ckpt)
    _edit_config(
        ckpt, rope_parameters=None, rope_theta=500000.0,
        rope_scaling={"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
    )
    assert load_model_config(ckpt) == new_style


def test_sharded_checkpoint_with_bf16_storage_loads(ckpt):
    tensors = load_file(str(ckpt / "model.safetensors"))
    (ckpt / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    index = {"metadata": {}, "weight_map": {}}
    for i, part in enumerate((names[:half], names[half:])):
        fname = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n].to(torch.bfloat16).contiguous() for n in part},
                  str(ckpt / fname))
        index["weight_map"].update({n: fname for n in part})
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    cfg = load_model_config(ckpt)
    w = load_weights(ckpt, cfg, torch.float32)
    assert w.embed.dtype == torch.float32
    expect = tensors["model.embed_tokens.weight"].to(torch.bfloat16).float()
    assert torch.equal(w.embed, expect)


def test_unknown_architecture_lists_supported(ckpt):
    _edit_config(ckpt, architectures=["GPT2LMHeadModel"])
    with pytest.raises(CheckpointError, match=r"config.json.*GPT2LMHeadModel.*LlamaForCausalLM"):
        load_model_config(ckpt)


def test_unsupported_rope_type(ckpt):
    _edit_config(ckpt, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0})
    with pytest.raises(CheckpointError, match="yarn"):
        load_model_config(ckpt)


def test_missing_config(tmp_path):
    with pytest.raises(CheckpointError, match=r"config\.json"):
        load_model_config(tmp_path)


def _rewrite_weights(ckpt, fn):
    tensors = load_file(str(ckpt / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(ckpt / "model.safetensors"))


def test_missing_tensor_is_named(ckpt):
    _rewrite_weights(ckpt, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'model.layers.1.mlp.up_proj"):
        load_weights(ckpt, load_model_config(ckpt), torch.float32)


def test_wrong_shape_names_file_and_tensor(ckpt):
    def shrink(t):
        t["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(8, 128)

    _rewrite_weights(ckpt, shrink)
    with pytest.raises(CheckpointError, match=r"model.safetensors.*k_proj.weight.*\(8, 128\)"):
        load_weights(ckpt, load_model_config(ckpt), torch.float32)


def test_truncated_safetensors(ckpt):
    f = ckpt / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load_weights(ckpt, load_model_config(ckpt), torch.float32)


def test_missing_lm_head_without_tied_embeddings(ckpt):
    _rewrite_weights(ckpt, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match=r"lm_head\.weight"):
        load_weights(ckpt, load_model_config(ckpt), torch.float32)


def test_tied_embeddings_share_one_tensor(hf_checkpoint):
    kind, path, _ = hf_checkpoint
    cfg = load_model_config(path)
    w = load_weights(path, cfg, torch.float32)
    assert (w.lm_head is w.embed) == (kind == "qwen3")
    assert cfg.qk_norm == (kind == "qwen3") and cfg.qkv_bias == (kind == "qwen2")


def test_decode_step_weight_bytes(hf_checkpoint):
    """The roofline's numerator: the parameters a decode step reads, i.e. every parameter
    but an untied embedding table (transformers counts it; a step reads B of its rows)."""
    kind, path, hf = hf_checkpoint
    w = load_weights(path, load_model_config(path), torch.float32)
    params = sum(p.numel() for p in hf.parameters())  # tied: the shared tensor once
    embed = hf.model.embed_tokens.weight.numel()
    tied = hf.lm_head.weight is hf.model.embed_tokens.weight
    assert sum(iter_weight_bytes(w)) == 4 * (params if tied else params - embed), kind
