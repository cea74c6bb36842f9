"""The demo checkpoint: deterministic, loadable, and served by the CLI."""

from __future__ import annotations

import hashlib
import subprocess
import sys

from dualpace.demo_model import DemoSpec, make_demo_model

SMALL = DemoSpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                 intermediate_size=128)


def _digest(path):
    h = hashlib.sha256()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        h.update((path / name).read_bytes())
    return h.hexdigest()


def test_same_spec_same_bytes(tmp_path):
    a = make_demo_model(tmp_path / "a", SMALL)
    b = make_demo_model(tmp_path / "b", SMALL)
    assert _digest(a) == _digest(b)


def test_transformers_loads_it_and_agrees(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from dualpace import LLM, SamplingParams

    path = make_demo_model(tmp_path / "m", SMALL)
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    prompt = [256, 72, 105, 33]
    with torch.no_grad():
        ids = torch.tensor([prompt])
        hf.generation_config.eos_token_id = None
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=12, min_new_tokens=12, pad_token_id=0)[0, 4:].tolist()
    with LLM(str(path), gpu_device="cpu") as llm:
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12,
                                                    ignore_eos=True))[0]
    assert out.token_ids == ref


def test_cli_make_demo_model_and_generate(tmp_path):
    path = tmp_path / "cli"
    r = subprocess.run([sys.executable, "-m", "dualpace", "make-demo-model", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "meaningless" in r.stdout and (path / "model.safetensors").is_file()
    r = subprocess.run([sys.executable, "-m", "dualpace", "generate", "--model", str(path),
                        "--prompt", "Hi", "--max-tokens", "5"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "finish=" in r.stdout and "tokens/s" in r.stderr
    r = subprocess.run([sys.executable, "-m", "dualpace", "generate", "--model",
                        str(tmp_path / "nope")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "config.json" in r.stderr
