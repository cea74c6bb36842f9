"""End to end with real workers: 48 concurrent requests, a GPU KV pool that holds about 4 of
them, every policy and forced route, each output token-for-token equal to transformers'
greedy output for its prompt alone; the metrics show where the tokens came from."""

from __future__ import annotations

import random

import pytest

from dualpace import LLM, SamplingParams

from ..conftest import VOCAB, hf_greedy

N_REQ, MAX_TOKENS = 48, 12


@pytest.fixture(scope="module")
def workload(llama_checkpoint):
    path, hf = llama_checkpoint
    rng = random.Random(5)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(4, 40))] for _ in range(N_REQ)]
    return path, prompts, [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]


CASES = [
    ("dualpace", "0,0", "full-cpu"),
    ("dualpace", "64,0", "split-final"),
    ("dualpace", "1,0", "fused-assist"),
    ("gated", "", "fused-assist"),
    ("gpu-only", "", None),
]


@pytest.mark.parametrize("policy,thresholds,route", CASES,
                         ids=[f"{p}-{r or 'gpu'}" for p, _, r in CASES])
def test_policy_outputs_match_transformers(workload, policy, thresholds, route):
    path, prompts, expected = workload
    with LLM(str(path), gpu_device="cpu", gpu_kv_blocks=16, cpu_kv_gib=0.05, max_num_seqs=16,
             max_num_batched_tokens=256, policy=policy, assist_thresholds=thresholds) as llm:
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                    ignore_eos=True))
        m = llm.metrics()
    for o, want in zip(outs, expected):
        assert o.finish_reason == "length" and o.error is None
        assert o.token_ids == want
    cpu_tokens = m.get('dualpace:generation_tokens_total{engine="cpu"}', 0)
    gpu_tokens = m.get('dualpace:generation_tokens_total{engine="gpu"}', 0)
    assert cpu_tokens + gpu_tokens == N_REQ * MAX_TOKENS
    assert m['dualpace:request_success_total{finished_reason="length"}'] == N_REQ
    assert m['dualpace:kv_blocks_used{tier="gpu"}'] == 0
    if route is None:
        assert cpu_tokens == 0
        return
    assert cpu_tokens > 0, "the host tier was never used"
    calls = m.get(f'dualpace:dense_assist_calls_total{{route="{route}"}}', 0)
    if route == "full-cpu":
        assert not any(k.startswith("dualpace:dense_assist_calls_total") and v
                       for k, v in m.items())
    else:
        assert calls > 0, f"no {route} assist calls"
