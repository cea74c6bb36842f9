"""vLLM's request fields and extensions that clients rely on, through the official SDK:
/tokenize and /detokenize, return_token_ids, continuous usage, usage details, int64 seeds,
vocabulary checks, and no silent drops (a field DualPace does not implement is a 400 naming
it, while its no-op value passes). vLLM's tests/entrypoints/openai are the reference."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer as HFTokenizer

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]


def _client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)



@pytest.fixture(scope="module")
def hf_tok(tiny_model):
    """The checkpoint's tokenizer.json read by the tokenizers library itself (the oracle)."""
    return HFTokenizer.from_file(str(Path(tiny_model) / "tokenizer.json"))


def test_tokenize_prompt_and_messages(server, hf_tok):
    prompt = "DualPace tokenizes this. 🚀"
    for special in (False, True):
        status, r = server.post_json("/tokenize", {"model": "tiny", "prompt": prompt,
                                                "add_special_tokens": special})
        want = hf_tok.encode(prompt, add_special_tokens=special).ids
        assert status == 200 and r["tokens"] == want and r["count"] == len(want)
        assert r["max_model_len"] == 512 and r["token_strs"] is None
    status, r = server.post_json("/tokenize", {"prompt": prompt, "return_token_strs": True})
    assert r["token_strs"] == [hf_tok.id_to_token(t) for t in r["tokens"]]
    # The chat form is the very prompt a chat completion runs.
    status, r = server.post_json("/tokenize", {"messages": MSGS})
    chat = _client(server).chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=2, temperature=0,
        extra_body={"return_token_ids": True})
    assert r["tokens"] == chat.model_extra["prompt_token_ids"]
    assert r["count"] == chat.usage.prompt_tokens
    status, no_gen = server.post_json("/tokenize", {"messages": MSGS,
                                                 "add_generation_prompt": False})
    assert status == 200 and no_gen["count"] < r["count"]
    assert r["tokens"][:no_gen["count"]] == no_gen["tokens"]


def test_detokenize_round_trip(server, hf_tok):
    ids = hf_tok.encode("round trip, with spaces", add_special_tokens=False).ids
    status, r = server.post_json("/detokenize", {"model": "tiny", "tokens": ids})
    assert status == 200 and r == {"prompt": hf_tok.decode(ids, skip_special_tokens=False)}
    assert r["prompt"] == "round trip, with spaces"


def test_return_token_ids_completions(server, hf_tok):
    c = _client(server)
    kw = dict(model="tiny", prompt="Once upon", max_tokens=8, temperature=0,
              extra_body={"return_token_ids": True, "ignore_eos": True})
    r = c.completions.create(**kw)
    ch = r.choices[0].model_extra
    assert ch["prompt_token_ids"] == hf_tok.encode("Once upon").ids
    assert len(ch["token_ids"]) == 8 == r.usage.completion_tokens
    assert hf_tok.decode(ch["token_ids"]) == r.choices[0].text
    assert ch["prompt_logprobs"] is None
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    chunks = list(c.completions.create(stream=True, **kw))
    streamed = [t for x in chunks for t in x.choices[0].model_extra["token_ids"]]
    assert streamed == ch["token_ids"]
    assert chunks[0].choices[0].model_extra["prompt_token_ids"] == ch["prompt_token_ids"]
    assert all("prompt_token_ids" not in x.choices[0].model_extra for x in chunks[1:])
    plain = c.completions.create(model="tiny", prompt="Once upon", max_tokens=2)
    assert "token_ids" not in plain.choices[0].model_extra


def test_return_token_ids_chat_stream(server, hf_tok):
    c = _client(server)
    kw = dict(model="tiny", messages=MSGS, max_tokens=6, temperature=0,
              extra_body={"return_token_ids": True, "ignore_eos": True})
    full = c.chat.completions.create(**kw)
    ids = full.choices[0].model_extra["token_ids"]
    assert len(ids) == 6 and hf_tok.decode(ids) == full.choices[0].message.content
    chunks = list(c.chat.completions.create(stream=True, **kw))
    assert chunks[0].model_extra["prompt_token_ids"] == full.model_extra["prompt_token_ids"]
    assert all("prompt_token_ids" not in x.model_extra for x in chunks[1:])
    assert [t for x in chunks for t in x.choices[0].model_extra["token_ids"]] == ids


def test_continuous_usage_stats(server):
    chunks = list(_client(server).completions.create(
        model="tiny", prompt="count", max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True}))
    seen = [x.usage.completion_tokens for x in chunks if x.choices]
    assert seen == sorted(seen) and seen[-1] == 5 and seen[0] >= 1
    assert all(x.usage.prompt_tokens == chunks[-1].usage.prompt_tokens for x in chunks)
    assert not chunks[-1].choices and chunks[-1].usage.total_tokens == (
        chunks[-1].usage.prompt_tokens + 5)


def test_negative_seed_is_an_int64_and_reproducible(server):
    c = _client(server)
    texts = {c.completions.create(model="tiny", prompt="seeded", max_tokens=6, seed=-(2**63),
                                  temperature=1.0).choices[0].text for _ in range(2)}
    assert len(texts) == 1


def test_out_of_vocabulary_stop_token_id_names_the_id_and_the_vocabulary(server, tiny_model):
    vocab = json.loads((Path(tiny_model) / "config.json").read_text())["vocab_size"]
    c = _client(server)
    c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=1,
                              extra_body={"stop_token_ids": [vocab - 1]})
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="tiny", messages=MSGS, max_tokens=1,
                                  extra_body={"stop_token_ids": [vocab + 1]})
    assert str(vocab + 1) in str(e.value) and str(vocab) in str(e.value)


def test_no_op_values_of_unsupported_fields_pass(server):
    """What SDKs send by default asks for nothing and must not be refused."""
    r = _client(server).chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=2, presence_penalty=0, frequency_penalty=0.0,
        logprobs=False, n=1, tools=[], response_format={"type": "text"}, logit_bias={},
        extra_body={"repetition_penalty": 1.0, "min_tokens": 0, "echo": False,
                    "skip_special_tokens": True, "tool_choice": "none"})
    assert r.choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("field,value", [("best_of", 3), ("min_p", 0.1),
                                         ("use_beam_search", True), ("guided_json", {"a": 1})])
def test_unsupported_fields_are_refused_by_name(server, field, value):
    status, r = server.post_json("/v1/completions", {"model": "tiny", "prompt": "x", field: value})
    assert status == 400 and r["error"]["param"] == field and field in r["error"]["message"]
