"""logprobs through the OpenAI API, from whichever tier sampled the token: a GPU pool too
small for the load puts requests on the CPU tier (Full-CPU, and Fused-Assist, where the GPU
side of the Dense Assist samples and returns them through the assist buffer). Prompt
logprobs (echo, prompt_logprobs) come out of the prefill on either path: chunked on the GPU
(a 48-token batch limit) or Prefill-to-CPU. Every value is checked against transformers'
log-softmax on the same checkpoint (fp32)."""

from __future__ import annotations

import concurrent.futures as cf

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

K = 3
ATOL = 2e-3


@pytest.fixture(scope="module")
def hf(tiny_model):
    return AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32).eval()


def _client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _hf_logprobs(hf, prompt: list[int], out: list[int]) -> torch.Tensor:
    """[len(out), V]: log-softmax of the logits that predicted each output token."""
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + out])).logits[0].float()
    return logits[len(prompt) - 1:len(prompt) + len(out) - 1].log_softmax(-1)


def _check_against_hf(hf, prompt, out, token_logprobs, top_values):
    ref = _hf_logprobs(hf, prompt, out)
    for i, t in enumerate(out):
        assert token_logprobs[i] == pytest.approx(ref[i, t].item(), abs=ATOL)
        want = ref[i].topk(len(top_values[i])).values.tolist()
        assert sorted(top_values[i], reverse=True) == pytest.approx(want, abs=ATOL)


def test_completion_logprobs_from_both_tiers(tiers, hf):
    c = _client(tiers)
    # ~70-token prompts: the 8-block GPU pool holds two at most, the rest go to the CPU tier
    prompts = [f"request number {i} says " + "abcdefghij" * 6 for i in range(6)]

    def one(p):
        return c.completions.create(model="tiny", prompt=p, max_tokens=30, temperature=0,
                                    logprobs=K,
                                    extra_body={"return_token_ids": True, "ignore_eos": True,
                                                "return_tokens_as_token_ids": True})

    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        results = list(ex.map(one, prompts))
    m = tiers.metrics()
    assert m.get('dualpace:generation_tokens_total{engine="cpu"}', 0) > 0, "CPU tier unused"
    assert m.get('dualpace:generation_tokens_total{engine="gpu"}', 0) > 0, "GPU tier unused"
    if tiers.route == "fused-assist":  # the GPU side sampled the CPU tier's tokens
        assert m.get('dualpace:dense_assist_calls_total{route="fused-assist"}', 0) > 0
    for r in results:
        ch = r.choices[0]
        prompt, out = ch.model_extra["prompt_token_ids"], ch.model_extra["token_ids"]
        lp = ch.logprobs
        assert len(lp.tokens) == len(out) == 30
        assert lp.tokens == [f"token_id:{t}" for t in out]
        assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(30)]
        ref = _hf_logprobs(hf, prompt, out)
        for i, t in enumerate(out):
            assert lp.token_logprobs[i] == pytest.approx(ref[i, t].item(), abs=ATOL)
            # the top K by id, plus the sampled token (greedy: it is the first of them)
            want = dict(zip(*(x.tolist() for x in reversed(ref[i].topk(K)))))
            got = {int(k.removeprefix("token_id:")): v for k, v in lp.top_logprobs[i].items()}
            assert set(got) == set(want) and t in got
            assert [got[j] for j in want] == pytest.approx(list(want.values()), abs=ATOL)


def test_streamed_logprobs_match_the_response(tiers, hf):
    c = _client(tiers)
    kw = dict(model="tiny", prompt="stream me", max_tokens=12, temperature=0, logprobs=2,
              extra_body={"return_token_ids": True, "ignore_eos": True})
    chunks = list(c.completions.create(stream=True, **kw))
    tokens = [t for x in chunks for t in x.choices[0].logprobs.tokens]
    values = [v for x in chunks for v in x.choices[0].logprobs.token_logprobs]
    offsets = [o for x in chunks for o in x.choices[0].logprobs.text_offset]
    ids = [t for x in chunks for t in x.choices[0].model_extra["token_ids"]]
    assert len(tokens) == len(values) == len(ids) == 12
    assert offsets == [sum(map(len, tokens[:i])) for i in range(12)]
    prompt = chunks[0].choices[0].model_extra["prompt_token_ids"]
    ref = _hf_logprobs(hf, prompt, ids)
    assert values == pytest.approx([ref[i, t].item() for i, t in enumerate(ids)], abs=ATOL)


def test_chat_logprobs_shape_and_values(tiers, hf):
    c = _client(tiers)
    msgs = [{"role": "user", "content": "say something"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, temperature=0,
                                  logprobs=True, top_logprobs=2,
                                  extra_body={"return_token_ids": True, "ignore_eos": True})
    content = r.choices[0].logprobs.content
    out = r.choices[0].model_extra["token_ids"]
    assert len(content) == len(out) == 8
    for e in content:
        assert e.bytes == list(e.token.encode("utf-8")) and len(e.top_logprobs) == 2
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
    _check_against_hf(hf, r.model_extra["prompt_token_ids"], out,
                      [e.logprob for e in content],
                      [[t.logprob for t in e.top_logprobs] for e in content])
    streamed = [e for x in c.chat.completions.create(stream=True, model="tiny", messages=msgs,
                                                     max_tokens=8, temperature=0,
                                                     logprobs=True, top_logprobs=2,
                                                     extra_body={"ignore_eos": True})
                if x.choices and x.choices[0].logprobs for e in x.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    plain = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=2)
    assert plain.choices[0].logprobs is None


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "logprobs": -1}, "logprobs"),
])
def test_logprobs_limits(server, body, param):
    c = _client(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny", **body)
    assert e.value.body["param"] == param


def test_chat_top_logprobs_limits(server):
    c = _client(server)
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.BadRequestError, match="greater than max allowed: 20"):
        c.chat.completions.create(model="tiny", messages=msgs, logprobs=True, top_logprobs=21)
    with pytest.raises(openai.BadRequestError, match="`logprobs` must be set to true"):
        c.chat.completions.create(model="tiny", messages=msgs, top_logprobs=2)


def test_echo_with_prompt_logprobs_on_both_prefill_paths(tiers, hf):
    """What lm-eval-harness's local-completions sends for a loglikelihood request: token ids,
    echo, logprobs=1, max_tokens=1."""
    c = _client(tiers)
    before = tiers.metrics().get('dualpace:kv_migrations_total{kind="prefill-to-cpu"}', 0)
    # Prompts of 50-70 tokens prefill on the GPU in 48-token chunks; those of 130-150 exceed
    # the 8-block (128-token) GPU pool and can only go Prefill-to-CPU.
    lens = [50, 130, 60, 140, 70, 150]
    prompts = [[65 + (i * 7 + j) % 26 for j in range(n)] for i, n in enumerate(lens)]

    def one(p):
        return c.completions.create(model="tiny", prompt=p, max_tokens=1, temperature=0,
                                    logprobs=1, echo=True, extra_body={"ignore_eos": True})

    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        results = list(ex.map(one, prompts))
    after = tiers.metrics().get('dualpace:kv_migrations_total{kind="prefill-to-cpu"}', 0)
    assert after > before, "no prompt took the Prefill-to-CPU path"
    for p, r in zip(prompts, results):
        ch = r.choices[0]
        lp = ch.logprobs
        assert ch.text.startswith(bytes(p).decode()) and len(lp.tokens) == len(p) + 1
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        with torch.no_grad():
            full = hf(torch.tensor([p])).logits[0].float().log_softmax(-1)
        want = [full[i - 1, p[i]].item() for i in range(1, len(p))]
        assert lp.token_logprobs[1:len(p)] == pytest.approx(want, abs=ATOL)
        assert lp.token_logprobs[-1] == pytest.approx(full[-1].max().item(), abs=ATOL)
        for i in range(1, len(p)):  # the top-1 entry and the actual token
            assert len(lp.top_logprobs[i]) <= 2
            assert max(lp.top_logprobs[i].values()) == pytest.approx(
                full[i - 1].max().item(), abs=ATOL)


def test_prompt_logprobs_field(tiers, hf):
    p = [72, 101, 108, 108, 111, 32] * 12  # 72 tokens: two chunks of 48 on the GPU path
    r = _client(tiers).completions.create(model="tiny", prompt=p, max_tokens=2,
                                          temperature=0, extra_body={"prompt_logprobs": 2})
    plp = r.choices[0].model_extra["prompt_logprobs"]
    assert len(plp) == len(p) and plp[0] is None
    with torch.no_grad():
        full = hf(torch.tensor([p])).logits[0].float().log_softmax(-1)
    for i in range(1, len(p)):
        row = full[i - 1]
        e = plp[i][str(p[i])]
        assert e["logprob"] == pytest.approx(row[p[i]].item(), abs=ATOL)
        assert e["rank"] == int((row > row[p[i]]).sum()) + 1
        top2 = row.topk(2).indices.tolist()
        assert all(str(t) in plp[i] for t in top2) and len(plp[i]) <= 3
