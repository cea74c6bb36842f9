"""Load generator that behaves like `vllm bench serve`: replays an Azure trace or a random
dataset against an OpenAI-compatible /v1/completions endpoint with SSE streaming.

    python bench/loadgen.py --base-url http://127.0.0.1:8000 \\
        --trace ../shared/traces/AzureLLMInferenceTrace_conv.csv --num-requests 200 \\
        --request-rate 4 --clip-input 512 --clip-output 128 --save-result out.json --json

Per request: TTFT (the first chunk of its choice), every gap between chunks, TPOT, end-to-end
latency, normalized latency (E2E / output tokens), output tokens from the usage chunk;
failures are counted, never dropped. ``--sweep R1,R2,..`` runs several rates, reads off the
sustainable rate for each target by linear interpolation between measured points (never
extrapolated: a target outside the sweep gives null) and draws PNG plots.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp

# The workload and the summary are the package's, so the simulator replays the same jobs at
# the same offsets and reports the same keys (dualpace/workload.py).
from dualpace.workload import (
    Job,
    Result,
    arrival_times,
    load_trace,
    random_jobs,
    summarize,
    sustainable_rate,
)

# --- one request -----------------------------------------------------------------------------


async def send(session: aiohttp.ClientSession, url: str, model: str | None, job: Job,
               api_key: str | None) -> Result:
    body = {"prompt": job.prompt, "max_tokens": job.max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0.0, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    res = Result(input_len=len(job.prompt))
    t0 = res.start = time.perf_counter()
    last = None
    try:
        async with session.post(url + "/v1/completions", json=body, headers=headers) as r:
            if r.status != 200:
                res.error = f"HTTP {r.status}: {(await r.text())[:200]}"
                return res
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = str(chunk["error"].get("message", chunk["error"]))
                    return res
                if chunk.get("usage"):
                    res.output_tokens = chunk["usage"]["completion_tokens"]
                # As `vllm bench serve`: every chunk of the choice counts, empty text too
                # (a token the server holds back as part of a character still streams as
                # its own chunk there and here), so TTFT and gaps are per token.
                if chunk.get("choices"):
                    now = time.perf_counter()
                    if last is None:
                        res.ttft = now - t0
                    else:
                        res.itl.append(now - last)
                    last = now
        res.e2e = time.perf_counter() - t0
        res.ok = last is not None or res.output_tokens == 0
        if not res.ok:
            res.error = "no content received"
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


# --- a run at one rate -----------------------------------------------------------------------


async def run_rate(args, jobs: list[Job], rate: float, keep: list | None = None) -> dict:
    """One Poisson (or replayed) run at ``rate``: the summary; ``keep``, when given, also
    gets every request's Result (its send time on the monotonic clock included)."""
    offsets = arrival_times(jobs, rate, args.burstiness, args.seed, args.replay_timestamps,
                            args.timestamp_scale)
    sem = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    results: list[Result] = [Result() for _ in jobs]
    done = 0

    async def one(i: int, job: Job, session) -> None:
        nonlocal done
        await asyncio.sleep(max(0.0, offsets[i] - (time.perf_counter() - t_start)))
        if sem:
            async with sem:
                results[i] = await send(session, args.base_url, args.model, job, args.api_key)
        else:
            results[i] = await send(session, args.base_url, args.model, job, args.api_key)
        done += 1
        if not args.no_progress:
            print(f"\r[rate {rate}] {done}/{len(jobs)} requests", end="", file=sys.stderr,
                  flush=True)

    # A connection per request, as vLLM's client does (a session per request): a server
    # that closes kept-alive connections (llama-server's HTTP library does, after a few
    # requests) would otherwise race the reuse and fail requests that never reached it.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        t_start = time.perf_counter()
        await asyncio.gather(*(one(i, j, session) for i, j in enumerate(jobs)))
        duration = time.perf_counter() - t_start
    if not args.no_progress:
        print(file=sys.stderr)
    out = summarize(results, duration, args.save_detailed)
    out["request_rate"] = rate
    if keep is not None:
        keep.extend(results)
    return out


# --- sweeps ----------------------------------------------------------------------------------

TARGETS = {"mean_normalized_latency_s": "target_normalized_latency",
           "p99_ttft_ms": "target_p99_ttft_ms", "p99_itl_ms": "target_p99_itl_ms",
           "p99_tpot_ms": "target_p99_tpot_ms"}


def plot_sweep(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = ["mean_normalized_latency_s", "p99_ttft_ms", "p99_itl_ms", "p99_tpot_ms"]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.5))
    rates = [r["request_rate"] for r in runs]
    for ax, m in zip(axes, metrics):
        ax.plot(rates, [r[m] for r in runs], marker="o")
        ax.set_xlabel("request rate (req/s)")
        ax.set_title(m)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--trace", help="Azure trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens)")
    ap.add_argument("--dataset", choices=["random"], default=None)
    ap.add_argument("--num-requests", type=int, default=100)
    ap.add_argument("--random-input-len", type=int, default=128)
    ap.add_argument("--random-output-len", type=int, default=64)
    ap.add_argument("--random-range-ratio", type=float, default=0.0)
    ap.add_argument("--clip-input", type=int, default=0)
    ap.add_argument("--clip-output", type=int, default=0)
    ap.add_argument("--token-range", type=int, default=256,
                    help="prompt token ids are drawn from [0, N): keep N <= the vocabulary")
    ap.add_argument("--request-rate", type=float, default=float("inf"))
    ap.add_argument("--burstiness", type=float, default=1.0)
    ap.add_argument("--max-concurrency", type=int, default=0)
    ap.add_argument("--replay-timestamps", action="store_true")
    ap.add_argument("--timestamp-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--request-timeout", type=float, default=6 * 3600)
    ap.add_argument("--sweep", default=None, help="comma-separated request rates")
    for metric, flag in TARGETS.items():
        ap.add_argument("--" + flag.replace("_", "-"), type=float, default=None,
                        help=f"sustainable-rate target for {metric}")
    ap.add_argument("--plot", default=None, help="PNG path for the sweep plots")
    ap.add_argument("--save-result", default=None)
    ap.add_argument("--save-detailed", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.burstiness <= 0:
        ap.error("--burstiness must be > 0")
    if args.trace:
        jobs = load_trace(args.trace, args.num_requests, args.clip_input, args.clip_output,
                          args.token_range, args.seed)
    elif args.dataset == "random":
        jobs = random_jobs(args.num_requests, args.random_input_len, args.random_output_len,
                           args.random_range_ratio, args.token_range, args.seed)
    else:
        ap.error("give --trace CSV or --dataset random")
    if args.sweep:
        rates = [float(x) for x in args.sweep.split(",")]
        runs = [asyncio.run(run_rate(args, jobs, r)) for r in rates]
        result = {"runs": runs, "sustainable_rate": {}}
        for metric, flag in TARGETS.items():
            target = getattr(args, flag)
            if target is not None:
                result["sustainable_rate"][metric] = sustainable_rate(
                    rates, [r[metric] for r in runs], target)
        if args.plot:
            plot_sweep(runs, Path(args.plot))
    else:
        result = asyncio.run(run_rate(args, jobs, args.request_rate))
    if args.save_result:
        Path(args.save_result).write_text(json.dumps(result, indent=2))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
