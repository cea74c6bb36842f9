"""The server as OpenAI clients see it: the official SDK, raw SSE, and the GET routes."""

from __future__ import annotations

import json
import urllib.request

import openai


def _client(server, key="none"):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def test_completions_non_streaming_and_streaming(server):
    c = _client(server)
    r = c.completions.create(model="tiny", prompt="Hello", max_tokens=6, temperature=0,
                             extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6
    chunks = list(c.completions.create(model="tiny", prompt="Hello", max_tokens=6,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == r.choices[0].text
    assert chunks[-1].usage.completion_tokens == 6 and not chunks[-1].choices
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finals[-1] == "length" and all(f is None for f in finals[:-1])


def test_chat_streaming_role_with_first_token(server):
    c = _client(server)
    msgs = [{"role": "user", "content": "hi there"}]
    full = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert full.choices[0].message.role == "assistant"
    chunks = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    content = [ch for ch in chunks if ch.choices]
    assert content[0].choices[0].delta.role == "assistant"
    assert all(ch.choices[0].delta.role is None for ch in content[1:])
    assert "".join(ch.choices[0].delta.content or "" for ch in content) == (
        full.choices[0].message.content)
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_raw_sse_framing(server):
    body = json.dumps({"model": "tiny", "prompt": [256, 72, 105], "max_tokens": 3,
                       "stream": True, "ignore_eos": True}).encode()
    req = urllib.request.Request(server.url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for ev in events[:-2]:
        assert ev.startswith("data: {")
        json.loads(ev[6:])


def test_stop_string_not_emitted(server):
    c = _client(server)
    base = c.completions.create(model="tiny", prompt=[256, 65, 66], max_tokens=20,
                                temperature=0, extra_body={"ignore_eos": True})
    text = base.choices[0].text
    stop = next((text[i:i + 2] for i in range(3, len(text) - 2)
                 if "\ufffd" not in text[i:i + 2]), None)
    assert stop, text
    for stream in (False, True):
        r = c.completions.create(model="tiny", prompt=[256, 65, 66], max_tokens=20,
                                 temperature=0, stop=[stop], stream=stream,
                                 extra_body={"ignore_eos": True})
        if stream:
            got = "".join(ch.choices[0].text for ch in r if ch.choices)
        else:
            got = r.choices[0].text
            assert r.choices[0].finish_reason == "stop"
        assert got == text[: text.index(stop)]


def test_get_routes(server):
    models = server.get_json("/v1/models")["data"]
    assert models[0]["id"] == "tiny" and models[0]["max_model_len"] == 512
    assert server.get_json("/health")["status"] == "ok"
    assert "version" in server.get_json("/version")
    m = server.metrics()
    assert m['dualpace:kv_blocks_total{tier="gpu"}'] == 64
    assert "dualpace:time_to_first_token_seconds_count" in m
    assert any(k.startswith('dualpace:time_to_first_token_seconds_bucket{le="') for k in m)


def test_stream_has_a_chunk_per_token_empty_while_a_character_is_held_back(server):
    """vLLM's stream: every generated token is its own chunk, with empty text while the
    detokenizer holds back part of a character (this byte-level model emits them often), so
    a client times every token; the texts still join to the non-streamed completion."""
    c = _client(server)
    kw = dict(model="tiny", prompt=[256, 200, 150], max_tokens=48, temperature=1.0, seed=7,
              extra_body={"ignore_eos": True, "return_token_ids": True})
    full = c.completions.create(**kw)
    chunks = [ch for ch in c.completions.create(stream=True, **kw) if ch.choices]
    per_chunk = [ch.choices[0].model_extra["token_ids"] for ch in chunks]
    assert [len(ids) for ids in per_chunk] == [1] * 48
    assert [t for ids in per_chunk for t in ids] == full.choices[0].model_extra["token_ids"]
    assert "".join(ch.choices[0].text for ch in chunks) == full.choices[0].text
    held = [ids[0] for ch, ids in zip(chunks, per_chunk) if ch.choices[0].text == ""]
    assert held and all(t >= 0x80 for t in held), held  # lead/continuation bytes only
