"""bench/peers: the shared checkpoint's two tokenizers, and the transformers floor server."""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path[:0] = [str(BENCH), str(BENCH / "peers")]

import compare_peers  # noqa: E402
import loadgen  # noqa: E402
import peer_model  # noqa: E402
import sentencepiece as spm  # noqa: E402
from tokenizers import Tokenizer as HFTokenizer  # noqa: E402
from tokenizers import pre_tokenizers  # noqa: E402

from dualpace import LLM, SamplingParams  # noqa: E402
from dualpace.demo_model import DemoSpec  # noqa: E402
from dualpace.tokenizer.tokenizer import Tokenizer  # noqa: E402

from .app_thread import serve_in_thread  # noqa: E402

TINY = DemoSpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                intermediate_size=128, max_position_embeddings=512)


@pytest.fixture(scope="module")
def peer_ckpt(tmp_path_factory) -> Path:
    return peer_model.make_peer_model(tmp_path_factory.mktemp("peer"), TINY, vocab_size=1000)


def test_dualpace_tokenizer_splits_like_sentencepiece(peer_ckpt):
    sp = spm.SentencePieceProcessor(model_file=str(peer_ckpt / "tokenizer.model"))
    ours = Tokenizer(peer_ckpt)
    for text in peer_model.AGREEMENT_TEXTS:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == sp.encode(text), text
        assert ours.decode(ids) == text == sp.decode(ids)
    # A prompt gets BOS (<s> = 1) once, as llama.cpp adds it for this vocabulary.
    assert ours.encode("hello")[:1] == [1] and ours.encode("hello")[1:] == sp.encode("hello")


def test_agreement_check_catches_the_usual_conversion_slip(peer_ckpt, tmp_path):
    # The common hand conversion (a Metaspace pre-tokenizer) drops the dummy prefix before a
    # leading space; the check must notice.
    for name in ("tokenizer.model",):
        (tmp_path / name).write_bytes((peer_ckpt / name).read_bytes())
    tok = HFTokenizer.from_file(str(peer_ckpt / "tokenizer.json"))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                 split=False)
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(AssertionError, match="tokenizers disagree"):
        peer_model.check_tokenizers_agree(tmp_path)


@pytest.fixture(scope="module")
def floor_url(peer_ckpt):
    import hf_server

    with serve_in_thread(hf_server.make_app(hf_server.Floor(str(peer_ckpt), threads=1))) as url:
        yield url


def _post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_floor_greedy_tokens_equal_dualpace(peer_ckpt, floor_url):
    prompts = ["def f(x):", "  indented text", "naïve café"]
    with LLM(str(peer_ckpt), gpu_device="cpu", gpu_kv_blocks=32) as llm:
        ours = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12,
                                                    ignore_eos=True))
    for prompt, out in zip(prompts, ours):
        status, body = _post(floor_url, {"prompt": prompt, "max_tokens": 12, "temperature": 0,
                                         "ignore_eos": True, "return_token_ids": True})
        assert status == 200
        res = json.loads(body)
        assert res["usage"]["completion_tokens"] == 12
        # Token ids, not text: a random model emits stray byte-fallback tokens, and invalid
        # UTF-8 has no single right rendering (whole decode vs incremental windows).
        assert res["choices"][0]["token_ids"] == out.token_ids
        if "\ufffd" not in out.text:
            assert res["choices"][0]["text"] == out.text


def test_floor_streams_what_it_returns_and_loadgen_counts_it(floor_url):
    body = {"prompt": [5, 6, 7, 8], "max_tokens": 9, "temperature": 0, "ignore_eos": True}
    _, whole = _post(floor_url, body)
    _, streamed = _post(floor_url, {**body, "stream": True,
                                    "stream_options": {"include_usage": True}})
    events = [json.loads(line[6:]) for line in streamed.decode().splitlines()
              if line.startswith("data: {")]
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == \
        json.loads(whole)["choices"][0]["text"]
    assert events[-1]["usage"]["completion_tokens"] == 9
    assert streamed.decode().rstrip().endswith("data: [DONE]")

    jobs = [loadgen.Job([3 + i, 40, 41], 5 + i) for i in range(4)]
    args = type("A", (), dict(base_url=floor_url, model=None, api_key=None, burstiness=1.0,
                              seed=0, replay_timestamps=False, timestamp_scale=1.0,
                              max_concurrency=2, request_timeout=60, save_detailed=False,
                              no_progress=True))
    res = asyncio.run(loadgen.run_rate(args, jobs, float("inf")))
    assert res["completed"] == 4 and res["failed"] == 0
    assert res["total_output_tokens"] == sum(j.max_tokens for j in jobs)


@pytest.mark.parametrize("body,needle", [
    ({"prompt": [1, 2, 1000]}, "token ids must be in [0, 1000)"),
    ({"prompt": []}, "prompt must be"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "n": 2}, "unsupported fields"),
    ({"prompt": "x", "max_tokens": 600}, "exceeds the context length 512"),
])
def test_floor_rejects_bad_requests(floor_url, body, needle):
    status, raw = _post(floor_url, body)
    assert status == 400
    assert needle in json.loads(raw)["error"]["message"]


@pytest.mark.parametrize("from_trace", [True, False])
def test_no_phase_or_round_replays_a_prompt(tmp_path, from_trace):
    """llama-server skips the prefill of a prompt a slot has seen (its prompt cache): each
    round takes the next trace rows, and within it the single-stream phase the rows after
    the concurrent ones, so no server sees a prompt twice."""
    trace = tmp_path / "trace.csv"
    if from_trace:
        trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
            f"2023-11-16 18:15:{10 + i:02d}.0000000,{40 + i},{5 + i}\n" for i in range(24)))
    args = type("A", (), {"trace": str(trace), "num_requests": 8, "single_requests": 3,
                          "clip_input": 256, "clip_output": 128})()
    rounds = compare_peers.phase_jobs(args, 1000, rounds=2)
    assert [(len(c), len(s)) for c, s in rounds] == [(8, 3), (8, 3)]
    prompts = [tuple(j.prompt) for c, s in rounds for j in c + s]
    assert len(set(prompts)) == len(prompts) == 22
    if from_trace:  # the trace's rows in order: per round 8 concurrent, then 3 single
        assert [len(j.prompt) for c, s in rounds for j in c + s] == [40 + i for i in range(22)]
        with pytest.raises(SystemExit, match="3 rounds of 11 jobs need 33"):
            compare_peers.phase_jobs(args, 1000, rounds=3)


def test_rounds_alternate_the_peers_and_ratios_are_per_round(monkeypatch):
    """The peers take turns phase by phase, their order rotating each round; a phase's
    figure is the median over the rounds and the ratio the median of per-round ratios (not
    the ratio of medians)."""
    calls = []
    speed = {"dualpace": [100.0, 50.0, 90.0], "llama.cpp": [80.0, 40.0, 100.0]}

    def fake_load(url, jobs, concurrency):
        n = sum(1 for u, _, c in calls if u == url and c == concurrency)
        calls.append((url, len(jobs), concurrency))
        t = speed[url][n]
        return {"completed": len(jobs), "failed": 0, "output_throughput": t * concurrency,
                "median_ttft_ms": 1000.0 / t}

    monkeypatch.setattr(compare_peers, "load", fake_load)
    rounds = [([object()] * 4, [object()] * 2)] * 3
    per_round = compare_peers.run_rounds({"dualpace": "dualpace", "llama.cpp": "llama.cpp"},
                                         rounds, 8)
    assert [(u, c) for u, _, c in calls] == [
        ("dualpace", 1), ("llama.cpp", 1), ("dualpace", 8), ("llama.cpp", 8),
        ("llama.cpp", 1), ("dualpace", 1), ("llama.cpp", 8), ("dualpace", 8),
        ("dualpace", 1), ("llama.cpp", 1), ("dualpace", 8), ("llama.cpp", 8)]
    out = compare_peers.summarize(per_round)
    single = out["llama.cpp"]["single"]
    assert single["output_throughput"] == 80.0  # median of 80, 40, 100
    assert out["dualpace"]["single"]["output_throughput"] == 90.0
    # per-round ratios 1.25, 1.25, 0.9 -> 1.25 (the ratio of the medians would be 1.125)
    assert single["dualpace_vs_this"] == 1.25
    assert single["completed"] == 6 and len(single["rounds"]) == 3
    assert "dualpace_vs_this" not in out["dualpace"]["single"]
