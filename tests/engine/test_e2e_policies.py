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


def _generate_exact(llm: LLM, prompts, expected) -> dict[str, float]:
    """Greedy outputs token-for-token equal to ``expected``; returns the metrics."""
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                ignore_eos=True))
    for o, want in zip(outs, expected):
        assert o.finish_reason == "length" and o.error is None
        assert o.token_ids == want
    return llm.metrics()


CASES = [
    ("dualpace", "", "full-cpu"),  # no thresholds: F = C, Dense Assist off (§4.2)
    ("dualpace", "64,0", "split-final"),
    ("dualpace", "0,0", "fused-assist"),  # Eq. 5 literally: every batch b >= 1 > P = 0
    ("gated", "", "neo-pipeline"),  # NEO: dense stages on the GPU, attention on the CPU
    ("gpu-only", "", None),
]


@pytest.mark.parametrize("policy,thresholds,route", CASES,
                         ids=[f"{p}-{r or 'gpu'}" for p, _, r in CASES])
def test_policy_outputs_match_transformers(workload, policy, thresholds, route):
    path, prompts, expected = workload
    with LLM(str(path), gpu_device="cpu", gpu_kv_blocks=16, cpu_kv_gib=0.05, max_num_seqs=16,
             max_num_batched_tokens=256, policy=policy, assist_thresholds=thresholds) as llm:
        m = _generate_exact(llm, prompts, expected)
    cpu_tokens = m.get('dualpace:generation_tokens_total{engine="cpu"}', 0)
    gpu_tokens = m.get('dualpace:generation_tokens_total{engine="gpu"}', 0)
    assert cpu_tokens + gpu_tokens == N_REQ * MAX_TOKENS
    assert m['dualpace:request_success_total{finished_reason="length"}'] == N_REQ
    assert m['dualpace:kv_blocks_used{tier="gpu"}'] == 0
    assert m['dualpace:kv_blocks_used{tier="cpu"}'] == 0  # no host-tier block leaked
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


def test_long_prompts_and_a_cpu_tier_larger_than_max_num_seqs(llama_checkpoint):
    """Prompts longer than the batched-token limit reach the host tier (Prefill-to-CPU alone
    in a round past the limit) and the CPU tier batches more requests than --max-num-seqs
    when C allows it, Fused-Assist included (the Assist Buffer is sized by C, not by
    --max-num-seqs); every output token-for-token equal to transformers'."""
    path, hf = llama_checkpoint
    rng = random.Random(11)
    lens = [100, 90] + [rng.randint(4, 20) for _ in range(12)]
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in lens]
    expected = [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]
    to_cpu_lens, cpu_batches = [], []

    def watch(engine, kind, plan):
        if kind == "gpu":
            to_cpu_lens.extend(len(r.prompt) for r in plan.to_cpu)
        else:
            cpu_batches.append(len(plan.batch))

    with LLM(str(path), gpu_device="cpu", gpu_kv_blocks=4, cpu_kv_gib=0.05, max_num_seqs=4,
             cpu_batch_limit=16, max_num_batched_tokens=32, assist_thresholds="0,0") as llm:
        llm._serving.engine.on_round = watch
        m = _generate_exact(llm, prompts, expected)
    assert {100, 90} <= set(to_cpu_lens), "a long prompt never went Prefill-to-CPU"
    assert max(cpu_batches) > 4, f"CPU batches {sorted(set(cpu_batches))} never exceeded 4"
    assert m['dualpace:dense_assist_calls_total{route="fused-assist"}'] > 0
    assert m['dualpace:kv_blocks_used{tier="cpu"}'] == 0
    assert m['dualpace:kv_blocks_used{tier="gpu"}'] == 0
