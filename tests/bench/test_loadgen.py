"""bench/loadgen.py against a tiny in-test SSE server with injected latencies."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import itertools

import loadgen

from .app_thread import free_port, serve_in_thread

TTFT, ITL, TOKENS = 0.060, 0.025, 6
ARRIVALS: list[float] = []  # when the fake server saw each request (perf_counter)


async def _completions(request: web.Request) -> web.StreamResponse:
    ARRIVALS.append(time.perf_counter())
    body = await request.json()
    n = min(TOKENS, body["max_tokens"])
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await asyncio.sleep(TTFT)
    for i in range(n):
        if i:
            await asyncio.sleep(ITL)
        # The first token is part of a character vLLM still holds back: an empty-text chunk
        # that TTFT must count (it is when the token was generated).
        chunk = {"choices": [{"index": 0, "text": "x" if i else "", "finish_reason": None}]}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]),
                                      "completion_tokens": n, "total_tokens": n}}
    await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
    return resp


@pytest.fixture(scope="module")
def fake_server():
    app = web.Application()
    app.router.add_post("/v1/completions", _completions)
    with serve_in_thread(app) as url:
        yield url


def test_measured_latencies_equal_the_injected_ones(fake_server, tmp_path, capsys):
    out = tmp_path / "r.json"
    loadgen.main(["--base-url", fake_server, "--dataset", "random", "--num-requests", "8",
                  "--random-input-len", "10", "--random-output-len", str(TOKENS),
                  "--request-rate", "inf", "--save-result", str(out), "--save-detailed",
                  "--no-progress", "--json"])
    res = json.loads(out.read_text())
    assert res["completed"] == 8 and res["failed"] == 0
    assert res["total_output_tokens"] == 8 * TOKENS
    # TTFT and end-to-end latency are never less than what the server waited (a measurement
    # from the wrong instant would be); on a loaded 2-core machine more, so the upper bounds
    # are ratios with room. Gaps between tokens are stamped when the client reads them: a
    # client delayed once reads two chunks together, so their mean only roughly holds.
    e2e = TTFT + (TOKENS - 1) * ITL
    for key, injected, low in (("mean_ttft_ms", TTFT * 1e3, 0.97), ("mean_itl_ms", ITL * 1e3, 0.5),
                               ("mean_tpot_ms", ITL * 1e3, 0.5),
                               ("mean_normalized_latency_s", e2e / TOKENS, 0.97)):
        assert injected * low <= res[key] < injected * 3, (key, res[key], injected)
    assert len(res["itls"]) == 8 and all(len(x) == TOKENS - 1 for x in res["itls"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last)["completed"] == 8


def test_requests_leave_on_their_poisson_schedule(fake_server, tmp_path):
    """The replayer sends request i no earlier than its scheduled offset (seeded gamma gaps
    spanning N / rate): a replayer that sends everything at once fails this."""
    n, rate, seed = 6, 10.0, 3
    ARRIVALS.clear()
    t0 = time.perf_counter()
    loadgen.main(["--base-url", fake_server, "--dataset", "random", "--num-requests", str(n),
                  "--random-input-len", "4", "--random-output-len", "1", "--request-rate",
                  str(rate), "--seed", str(seed), "--save-result", str(tmp_path / "r.json"),
                  "--no-progress"])
    planned = loadgen.arrival_times([None] * n, rate, 1.0, seed, False, 1.0)
    seen = sorted(t - t0 for t in ARRIVALS)
    assert len(seen) == n and planned[-1] > 0.2
    # Lower bounds only (a loaded machine delays, it never advances); the first request's
    # own offset absorbs the client's start-up time.
    for got, want in zip(seen, planned):
        assert got >= want - 0.01, (seen, planned)


def test_failures_are_counted(tmp_path):
    port = free_port()  # nothing listens there
    out = tmp_path / "r.json"
    loadgen.main(["--base-url", f"http://127.0.0.1:{port}", "--dataset", "random",
                  "--num-requests", "3", "--no-progress", "--save-result", str(out),
                  "--save-detailed"])
    res = json.loads(out.read_text())
    assert res["completed"] == 0 and res["failed"] == 3 and all(res["errors"])


def test_sustainable_rate_interpolates_and_never_extrapolates():
    rates, values = [1, 2, 4, 8], [0.2, 0.4, 0.8, 1.6]
    assert loadgen.sustainable_rate(rates, values, 0.6) == pytest.approx(3.0)
    assert loadgen.sustainable_rate(rates, values, 1.2) == pytest.approx(6.0)
    assert loadgen.sustainable_rate(rates, values, 0.1) is None  # below the sweep
    assert loadgen.sustainable_rate(rates, values, 5.0) is None  # beyond the sweep


def test_arrivals_span_n_over_rate_and_are_seeded():
    jobs = [loadgen.Job([1], 1) for _ in range(200)]
    a = loadgen.arrival_times(jobs, 10.0, 1.0, 7, False, 1.0)
    b = loadgen.arrival_times(jobs, 10.0, 1.0, 7, False, 1.0)
    assert a == b and a[0] == 0.0 and all(x <= y for x, y in itertools.pairwise(a))
    gaps_total = a[-1] + (a[-1] - a[-2])  # ~N/R: the normalised gaps sum to exactly N/R
    assert 18.0 < gaps_total < 22.0
    assert loadgen.arrival_times(jobs, float("inf"), 1.0, 7, False, 1.0) == [0.0] * 200


def test_trace_rows_keep_lengths(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:15:46.6805900,374,44\n"
                   "2023-11-16 18:15:50.9951690,396,109\n"
                   "2023-11-16 18:15:51.5000000,879,11\n")
    jobs = loadgen.load_trace(str(csv), 2, 0, 100, 256, 0)
    assert [len(j.prompt) for j in jobs] == [374, 396]
    assert [j.max_tokens for j in jobs] == [44, 100]
    assert jobs[1].timestamp == pytest.approx(4.3145790, abs=1e-4)
    replay = loadgen.arrival_times(jobs, 1.0, 1.0, 0, True, 0.5)
    assert replay[1] == pytest.approx(4.3145790 / 2, abs=1e-4)
