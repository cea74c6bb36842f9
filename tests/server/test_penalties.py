"""presence/frequency/repetition penalties, min_tokens and logit_bias through the API with
the CPU tier forced (Full-CPU, and Fused-Assist where the GPU side samples): greedy outputs
token-exact against transformers' logits with the penalties applied by a plain reference
(tests/sampling/test_penalties.py checks that reference against the definitions)."""

from __future__ import annotations

import concurrent.futures as cf
import json
from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from dualpace.sampling.penalties import Penalties

from ..sampling.test_penalties import reference

N = 24


@pytest.fixture(scope="module")
def hf(tiny_model):
    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def _greedy_reference(hf, prompt: list[int], p: Penalties, n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + out])).logits[0, -1].float().tolist()
        x = reference(logits, p, out)
        out.append(max(range(len(x)), key=x.__getitem__))
    return out


SETTINGS = [  # (request fields, the Penalties they mean; eos is ignored so stop_ids is ())
    ({"frequency_penalty": 1.5}, Penalties(frequency=1.5)),
    ({"presence_penalty": 2.0}, Penalties(presence=2.0)),
    ({"repetition_penalty": 1.8}, Penalties(repetition=1.8)),
    ({"logit_bias": {"65": 8.0, "66": -100}}, Penalties(bias=((65, 8.0), (66, -100.0)))),
    ({"frequency_penalty": -0.5, "presence_penalty": 0.5, "repetition_penalty": 0.9},
     Penalties(frequency=-0.5, presence=0.5, repetition=0.9)),
]


def test_penalties_token_exact_on_both_tiers(tiers, hf, tiny_model):
    c = openai.OpenAI(base_url=tiers.url + "/v1", api_key="none", max_retries=0)
    jobs = []
    for i, (fields, p) in enumerate(SETTINGS * 2):  # twice: more load than the GPU holds
        prompt = [72 + (i * 5 + j) % 20 for j in range(40 + 9 * i)]
        jobs.append((prompt, fields, p))

    def one(job):
        prompt, fields, _ = job
        r = c.completions.create(model="tiny", prompt=prompt, max_tokens=N, temperature=0,
                                 extra_body={"ignore_eos": True, "return_token_ids": True,
                                             **fields})
        return r.choices[0].model_extra["token_ids"]

    with cf.ThreadPoolExecutor(len(jobs)) as ex:
        outs = list(ex.map(one, jobs))
    m = tiers.metrics()
    assert m.get('dualpace:generation_tokens_total{engine="cpu"}', 0) > 0, "CPU tier unused"
    for (prompt, fields, p), got in zip(jobs, outs):
        if "repetition_penalty" in fields:
            p = Penalties(**{**{f: getattr(p, f) for f in Penalties.__struct_fields__},
                             "prompt": tuple(prompt)})
        assert got == _greedy_reference(hf, prompt, p, N), fields


def test_min_tokens_holds_eos_back(tiers, hf, tiny_model):
    eos = json.loads((Path(tiny_model) / "generation_config.json").read_text())["eos_token_id"]
    eos = eos if isinstance(eos, int) else eos[0]
    c = openai.OpenAI(base_url=tiers.url + "/v1", api_key="none", max_retries=0)
    # A bias that makes EOS the greedy choice at once: min_tokens still holds it back.
    kw = dict(model="tiny", prompt="min", temperature=0, max_tokens=10,
              logit_bias={str(eos): 100})
    assert c.completions.create(**kw).usage.completion_tokens == 1
    r = c.completions.create(**kw, extra_body={"min_tokens": 6})
    # six tokens that cannot be EOS, then EOS (counted, as vLLM counts it)
    assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "stop"
