"""Malformed input, dropped clients, the queue limit, API keys, drain and systemd notify."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from ..shm_util import owned_segments
from .conftest import ServerProcess

C, CH = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]
LONG = "x" * (5 << 20)

BAD = [  # (path, method, raw body or JSON, expected status, expected param or None)
    (C, "POST", b"not json", 400, None),
    (C, "POST", b"[1, 2]", 400, None),
    (C, "POST", {}, 400, "prompt"),
    (C, "POST", {"prompt": ""}, 400, "prompt"),
    (C, "POST", {"prompt": []}, 400, "prompt"),
    (C, "POST", {"prompt": [[]]}, 400, "prompt"),
    (C, "POST", {"prompt": 5}, 400, "prompt"),
    (C, "POST", {"prompt": [1, "a"]}, 400, "prompt"),
    (C, "POST", {"prompt": [999999]}, 400, "prompt"),
    (C, "POST", {"prompt": [-1]}, 400, "prompt"),
    (C, "POST", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    (C, "POST", {"prompt": "hi", "max_tokens": -5}, 400, "max_tokens"),
    (C, "POST", {"prompt": "hi", "max_tokens": "10"}, 400, "max_tokens"),
    (C, "POST", {"prompt": "hi", "max_tokens": 100000}, 400, None),
    (C, "POST", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    (C, "POST", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    (C, "POST", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    (C, "POST", {"prompt": "hi", "top_p": 2}, 400, "top_p"),
    (C, "POST", {"prompt": "hi", "top_k": -7}, 400, "top_k"),
    (C, "POST", {"prompt": "hi", "seed": 2**63}, 400, "seed"),
    (C, "POST", {"prompt": "hi", "seed": 1.5}, 400, "seed"),
    (C, "POST", {"prompt": "hi", "n": 129}, 400, "n"),
    (C, "POST", {"prompt": "hi", "n": 0}, 400, "n"),
    (C, "POST", {"prompt": "hi", "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    (C, "POST", {"prompt": "hi", "stop_token_ids": [999999]}, 400, "stop_token_ids"),
    (C, "POST", {"prompt": "hi", "stop_token_ids": [-1]}, 400, "stop_token_ids"),
    (CH, "POST", {"messages": MSG, "echo": True}, 400, "echo"),
    (C, "POST", {"prompt": "hi", "prompt_logprobs": 21}, 400, "prompt_logprobs"),
    (C, "POST", {"prompt": "hi", "presence_penalty": 2.5}, 400, "presence_penalty"),
    (C, "POST", {"prompt": "hi", "repetition_penalty": 0}, 400, "repetition_penalty"),
    (C, "POST", {"prompt": "hi", "min_tokens": 20, "max_tokens": 5}, 400, "min_tokens"),
    (C, "POST", {"prompt": "hi", "logit_bias": {"x": 1.0}}, 400, "logit_bias"),
    (C, "POST", {"prompt": "hi", "logit_bias": {"5": 101}}, 400, "logit_bias"),
    (C, "POST", {"prompt": "hi", "logit_bias": {"999999": 1}}, 400, "logit_bias"),
    (C, "POST", {"prompt": "hi", "suffix": "x"}, 400, "suffix"),
    (C, "POST", {"prompt": "hi", "response_format": {"type": "json_object"}}, 400,
     "response_format"),
    (C, "POST", {"prompt": "hi", "stop": 5}, 400, "stop"),
    (C, "POST", {"prompt": "hi", "stop": [""]}, 400, "stop"),
    (C, "POST", {"prompt": "hi", "stop_token_ids": ["a"]}, 400, "stop_token_ids"),
    (C, "POST", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    (C, "POST", {"prompt": "hi", "stream_options": 3}, 400, "stream_options"),
    (C, "POST", {"prompt": "hi", "ignore_eos": 1}, 400, "ignore_eos"),
    (C, "POST", {"prompt": "hi", "model": "gpt-9"}, 404, "model"),
    (C, "POST", {"prompt": "hi", "model": 3}, 400, "model"),
    (CH, "POST", {}, 400, "messages"),
    (CH, "POST", {"messages": []}, 400, "messages"),
    (CH, "POST", {"messages": "hi"}, 400, "messages"),
    (CH, "POST", {"messages": [{"content": "no role"}]}, 400, "messages"),
    (CH, "POST", {"messages": [{"role": "user", "content": 5}]}, 400, "messages"),
    (CH, "POST", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages"),
    (CH, "POST", {"messages": MSG, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    (CH, "POST", {"messages": [{"role": "user"}]}, 400, "messages"),
    (CH, "POST", {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}]},
     400, "tools"),
    (CH, "POST", {"messages": MSG, "tool_choice": "required"}, 400, "tool_choice"),
    (CH, "POST", {"messages": MSG, "logprobs": True, "top_logprobs": 21}, 400, "logprobs"),
    (CH, "POST", {"messages": MSG, "top_logprobs": 3}, 400, "top_logprobs"),
    (C, "POST", {"prompt": "hi", "logprobs": 99}, 400, "logprobs"),
    (CH, "POST", {"messages": MSG, "response_format": {"type": "json_schema"}}, 400,
     "response_format"),
    (CH, "POST", {"messages": MSG, "stream": False, "stream_options": {}}, 400,
     "stream_options"),
    ("/tokenize", "POST", {"prompt": "hi", "messages": MSG}, 400, "prompt"),
    ("/tokenize", "POST", {"prompt": 5}, 400, "prompt"),
    ("/detokenize", "POST", {"tokens": [1, "a"]}, 400, "tokens"),
    ("/detokenize", "POST", {"tokens": [10**9]}, 400, "tokens"),
    (C, "GET", None, 405, None),
    ("/v1/nothing", "GET", None, 404, None),
    ("/health", "POST", b"{}", 405, None),
    (C, "POST", json.dumps({"prompt": LONG}).encode(), 413, None),
]


def _request(server, path, method, body, headers=None, timeout=30):
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null"), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), dict(e.headers)


def test_malformed_requests_get_openai_errors(server):
    assert len(BAD) >= 30
    for path, method, body, status, param in BAD:
        got, payload, _ = _request(server, path, method, body)
        assert got == status, (path, body if not isinstance(body, bytes) else body[:40], payload)
        err = payload["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
        if param is not None:
            assert err["param"] == param, (body, err)
    ok, payload, _ = _request(server, C, "POST", {"prompt": "hi", "max_tokens": 2})
    assert ok == 200 and payload["choices"][0]["text"] is not None
    assert server.get_json("/health")["status"] == "ok"


def test_context_length_error_uses_vllm_wording(server):
    status, payload, _ = _request(server, C, "POST", {"prompt": [65] * 500, "max_tokens": 100})
    assert status == 400
    assert "This model's maximum context length is 512 tokens" in payload["error"]["message"]


def test_dropped_streams_free_their_kv(server):
    server.drop_streams({"model": "tiny", "prompt": "Hello there", "max_tokens": 400,
                         "ignore_eos": True}, 50)
    busy, m = server.wait_idle(10)
    assert busy == 0, m
    assert m['dualpace:request_success_total{finished_reason="abort"}'] >= 50


def test_queue_limit_and_api_key(tiny_model):
    s = ServerProcess(tiny_model, "--max-queued-requests", "2", "--api-key", "sekret")
    try:
        auth = {"Authorization": "Bearer sekret"}
        assert _request(s, C, "POST", {"prompt": "hi"})[0] == 401
        assert _request(s, C, "POST", {"prompt": "hi"}, {"Authorization": "Bearer no"})[0] == 401
        assert _request(s, "/v1/models", "GET", None, auth)[0] == 200
        assert s.get_json("/health")["status"] == "ok"  # only /v1/* needs the key
        statuses = []

        def slow():
            statuses.append(_request(s, C, "POST", {"prompt": "hi", "max_tokens": 500,
                                                    "ignore_eos": True}, auth))

        threads = [threading.Thread(target=slow) for _ in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # both admitted and generating
            m = s.metrics()
            if m.get('dualpace:generation_tokens_total{engine="gpu"}', 0) + m.get(
                    'dualpace:generation_tokens_total{engine="cpu"}', 0) >= 2:
                break
            time.sleep(0.01)
        status, _payload, headers = _request(s, C, "POST", {"prompt": "hi"}, auth)
        assert status == 503 and headers.get("Retry-After")
        for t in threads:
            t.join()
        assert [st for st, _, _ in statuses] == [200, 200]
    finally:
        s.stop()


def test_sigterm_drains_and_notifies(tiny_model, tmp_path):
    sock_path = str(tmp_path / "notify.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(sock_path)
    rx.settimeout(0.2)
    msgs: list[str] = []
    reading = threading.Event()
    reading.set()

    def systemd():  # reads as systemd does, all the time (an unread queue holds only 10)
        while reading.is_set():
            try:
                msgs.append(rx.recv(4096).decode())
            except TimeoutError:
                continue

    reader = threading.Thread(target=systemd, daemon=True)
    reader.start()
    # A drain long enough for a loaded 2-core machine: the test is that in-flight requests
    # complete (the drain-timeout cut has its own test in test_failures.py).
    # A 100 ms watchdog, a ping every 50 ms; the first ping is awaited before any request,
    # because the tiny model's four requests and the drain can end before a first ping.
    s = ServerProcess(tiny_model, "--drain-timeout", "600",
                      env={"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "100000"})
    assert owned_segments(s.proc.pid), "the server created no segments"
    try:
        deadline = time.monotonic() + 10
        while not any("WATCHDOG=1" in m for m in msgs):
            assert time.monotonic() < deadline, "no watchdog ping within 10 s of READY"
            time.sleep(0.01)
        results = []

        def inflight():
            results.append(_request(s, C, "POST", {"prompt": "hi", "max_tokens": 300,
                                                   "ignore_eos": True}, timeout=600))

        threads = [threading.Thread(target=inflight) for _ in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # all four generating (~0.5 s of work each)
            m = s.metrics()
            if m.get('dualpace:generation_tokens_total{engine="gpu"}', 0) + m.get(
                    'dualpace:generation_tokens_total{engine="cpu"}', 0) >= 8:
                break
            time.sleep(0.005)
        s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30  # until the server says it is draining
        while (health := _request(s, "/health", "GET", None))[0] != 503:
            assert time.monotonic() < deadline, "SIGTERM never put the server in draining"
            time.sleep(0.01)
        assert health[1]["status"] == "draining"
        health = health[0]
        status, payload, _ = _request(s, C, "POST", {"prompt": "late"})
        for t in threads:
            t.join(timeout=600)
        assert status == 503 and "shutting down" in payload["error"]["message"]
        assert health == 503
        assert [r[0] for r in results] == [200] * 4
        assert all(r[1]["choices"][0]["finish_reason"] == "length" for r in results)
        assert s.proc.wait(timeout=60) == 0
    finally:
        s.stop()
    time.sleep(0.5)  # the last datagrams
    reading.clear()
    reader.join(timeout=5)
    rx.close()
    joined = "\n".join(msgs)
    assert "READY=1" in joined and "WATCHDOG=1" in joined and "STOPPING=1" in joined
    assert "STATUS=" in joined
    assert not owned_segments(s.proc.pid), "the drained server left its segments"


@pytest.mark.parametrize("route", ["/metrics", "/version", "/v1/models"])
def test_get_routes_answer(server, route):
    with urllib.request.urlopen(server.url + route, timeout=10) as r:
        assert r.status == 200 and r.read()
