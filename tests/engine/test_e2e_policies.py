"""End to end with real workers: 48 concurrent requests, a GPU KV pool that holds about 4 of
them, every policy and forced route, each output token-for-token equal to transformers'
greedy output for its prompt alone; the metrics show where the tokens came from. The CPU
tier computes in fp32 here: its default on an AMX host is bf16, which is not token-exact."""

from __future__ import annotations

import asyncio
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
    with LLM(str(path), gpu_device="cpu", cpu_dtype="float32",
             gpu_kv_blocks=16, cpu_kv_gib=0.05, max_num_seqs=16,
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

    with LLM(str(path), gpu_device="cpu", cpu_dtype="float32",
             gpu_kv_blocks=4, cpu_kv_gib=0.05, max_num_seqs=4,
             cpu_batch_limit=16, max_num_batched_tokens=32, assist_thresholds="0,0") as llm:
        llm._serving.engine.on_round = watch
        m = _generate_exact(llm, prompts, expected)
    assert {100, 90} <= set(to_cpu_lens), "a long prompt never went Prefill-to-CPU"
    assert max(cpu_batches) > 4, f"CPU batches {sorted(set(cpu_batches))} never exceeded 4"
    assert m['dualpace:dense_assist_calls_total{route="fused-assist"}'] > 0
    assert m['dualpace:kv_blocks_used{tier="cpu"}'] == 0
    assert m['dualpace:kv_blocks_used{tier="gpu"}'] == 0


ABORT_CASES = {
    # name: (LLM options, does this round's plan hold the moment? -> a victim or None)
    "mid-swap-in": (dict(gpu_kv_blocks=16, max_num_batched_tokens=256),
                    lambda kind, plan: kind == "gpu" and plan.swap_in
                    and plan.swap_in[0].req),
    "mid-chunked-prefill": (dict(gpu_kv_blocks=64, max_num_batched_tokens=32),
                            lambda kind, plan: kind == "gpu" and next(
                                (r for r, n in plan.prefills if r.computed + n < r.num_tokens),
                                None)),
    "during-dense-assist": (dict(gpu_kv_blocks=16, max_num_batched_tokens=256,
                                 assist_thresholds="0,0"),
                            lambda kind, plan: kind == "cpu" and plan.batch
                            and plan.batch[-1]),
}


@pytest.mark.parametrize("case", list(ABORT_CASES))
def test_abort_mid_step_with_real_workers(workload, case):
    """A client abort that lands while a step involving the request runs (the round's hook
    schedules it for the next await, after dispatch): the request ends "abort" with a prefix
    of its greedy output, the others stay token-exact, no KV block leaks on either tier."""
    path, prompts, expected = workload
    prompts = [*prompts[:20], prompts[0] * 6]  # one long prompt to chunk
    options, moment = ABORT_CASES[case]
    victims: list[int] = []

    def hook(engine, kind, plan):
        r = moment(kind, plan) if not victims else None
        if r:
            victims.append(r.rid)
            asyncio.get_running_loop().call_soon(engine.abort, r.rid)

    with LLM(str(path), gpu_device="cpu", cpu_dtype="float32",
             cpu_kv_gib=0.05, max_num_seqs=16, **options) as llm:
        llm._serving.engine.on_round = hook
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                    ignore_eos=True))
        m = llm.metrics()
    assert victims, f"the run never reached the moment {case!r}"
    aborted = [o for o in outs if o.finish_reason == "abort"]
    assert len(aborted) == 1 and aborted[0].error is None
    for i, o in enumerate(outs):
        want = expected[i] if i < 20 else None
        if o.finish_reason == "abort":
            if want is not None:
                assert o.token_ids == want[:len(o.token_ids)]
            continue
        assert o.finish_reason == "length"
        if want is not None:
            assert o.token_ids == want
    assert m['dualpace:kv_blocks_used{tier="gpu"}'] == 0
    assert m['dualpace:kv_blocks_used{tier="cpu"}'] == 0


@pytest.mark.parametrize("policy,thresholds", [("dualpace", "0,0"), ("gated", "")])
def test_tensor_parallel_llm_is_token_exact(workload, policy, thresholds):
    """GPU TP 2 and CPU TP 2 through ``LLM``: both tiers, Dense Assist (dualpace) or the NEO
    pipeline (gated) across ranks, every output equal to transformers'."""
    path, prompts, expected = workload
    with LLM(str(path), gpu_device="cpu", cpu_dtype="float32",
             gpu_kv_blocks=16, cpu_kv_gib=0.05, max_num_seqs=16,
             max_num_batched_tokens=256, gpu_tp=2, cpu_tp=2, policy=policy,
             assist_thresholds=thresholds) as llm:
        m = _generate_exact(llm, prompts[:16], expected[:16])
    assert m['dualpace:generation_tokens_total{engine="cpu"}'] > 0
    assert sum(v for k, v in m.items() if k.startswith("dualpace:dense_assist_calls_total")) > 0
    assert m['dualpace:kv_blocks_used{tier="cpu"}'] == 0
