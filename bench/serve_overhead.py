"""The front end's share of latency: SSE clients vs the engine's own per-token timestamps.

    python bench/serve_overhead.py --json

Starts `dualpace serve` on the demo model (a subprocess), then for 1, 16 and 128 concurrent
streaming clients measures tokens/s and per-token latency (inter-token gaps, TTFT) as the
clients see them, and the same quantities from the engine's metrics over the same window
(generation_tokens_total, inter_token_latency_seconds, time_to_first_token_seconds; these
are stamped when a token is applied in the engine). overhead = client / engine - 1.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import subprocess
import sys
import time

import aiohttp
from common import emit, free_port, scrape_metrics, wait_healthy


def _delta(after, before, key):
    return after.get(key, 0.0) - before.get(key, 0.0)


async def _client(session, url, max_tokens):
    body = {"prompt": "The quick brown fox", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    stamps, tokens = [], 0
    async with session.post(url + "/v1/completions", json=body) as r:
        async for line in r.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            else:
                stamps.append(time.perf_counter())
    return t0, stamps, tokens


async def _round(url, clients, max_tokens):
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        return await asyncio.gather(*(_client(s, url, max_tokens) for _ in range(clients)))


def measure(url: str, clients: int, max_tokens: int) -> dict:
    before = scrape_metrics(url)
    t0 = time.perf_counter()
    results = asyncio.run(_round(url, clients, max_tokens))
    wall = time.perf_counter() - t0
    after = scrape_metrics(url)
    # A chunk can carry several tokens (text held back until a UTF-8 character completes),
    # so per-token time is (last chunk - first chunk) / (tokens - 1) from the usage count.
    tpots = [(st[-1] - st[0]) / (n - 1) for _, st, n in results if len(st) > 1 and n > 1]
    gaps = [b - a for _, st, _ in results for a, b in itertools.pairwise(st)]
    ttfts = [st[0] - start for start, st, _ in results if st]
    n_client = sum(n for _, _, n in results)
    n_engine = (_delta(after, before, 'dualpace:generation_tokens_total{engine="gpu"}')
                + _delta(after, before, 'dualpace:generation_tokens_total{engine="cpu"}'))
    itl_n = _delta(after, before, "dualpace:inter_token_latency_seconds_count")
    ttft_n = _delta(after, before, "dualpace:time_to_first_token_seconds_count")
    eng_itl = _delta(after, before, "dualpace:inter_token_latency_seconds_sum") / max(itl_n, 1)
    eng_ttft = _delta(after, before, "dualpace:time_to_first_token_seconds_sum") / max(ttft_n, 1)
    cli_itl = statistics.fmean(tpots) if tpots else 0.0
    cli_ttft = statistics.fmean(ttfts) if ttfts else 0.0
    return {
        "clients": clients, "wall_s": round(wall, 3),
        "client_tokens_per_s": round(n_client / wall, 1),
        "engine_tokens_per_s": round(n_engine / wall, 1),
        "client_tpot_ms_mean": round(cli_itl * 1e3, 3),
        "client_chunk_gap_ms_p99": round(sorted(gaps)[int(0.99 * (len(gaps) - 1))] * 1e3, 3)
        if gaps else 0.0,
        "engine_itl_ms_mean": round(eng_itl * 1e3, 3),
        "client_ttft_ms_mean": round(cli_ttft * 1e3, 2),
        "engine_ttft_ms_mean": round(eng_ttft * 1e3, 2),
        "itl_overhead": round(cli_itl / eng_itl - 1, 3) if eng_itl else None,
        "ttft_overhead": round(cli_ttft / eng_ttft - 1, 3) if eng_ttft else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--clients", default="1,16,128")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--model", default=None, help="checkpoint (default: the demo model)")
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "dualpace", "serve", "--port", str(port), "--gpu-device",
           "cpu", "--max-num-seqs", "128", "--log-level", "warning"]
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.Popen(cmd)
    try:
        wait_healthy(url, proc)
        measure(url, 4, 8)  # warm-up
        rows = [measure(url, int(c), args.max_tokens) for c in args.clients.split(",")]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    emit({"bench": "serve_overhead", "max_tokens": args.max_tokens, "results": rows},
         args.json)


if __name__ == "__main__":
    main()
