"""The workload and its latency summary, shared by the load generator (bench/loadgen.py,
real servers over HTTP) and the simulator (dualpace/sim, the same jobs on a virtual clock):
trace slices and random datasets, arrival offsets, per-request results, and the summary
keys `vllm bench serve` reports (TTFT, TPOT, ITL, E2E, normalized latency)."""

from __future__ import annotations

import csv
import itertools
import math
import random
import statistics
from dataclasses import dataclass, field


@dataclass
class Job:
    prompt: list[int]
    max_tokens: int
    timestamp: float = 0.0  # seconds from the trace start (for --replay-timestamps)


def load_trace(path: str, n: int, clip_in: int, clip_out: int, token_range: int,
               seed: int) -> list[Job]:
    rng = random.Random(seed)
    jobs, t0 = [], None
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if len(jobs) >= n:
                break
            ts = _parse_ts(row["TIMESTAMP"])
            t0 = ts if t0 is None else t0
            n_in = max(1, int(row["ContextTokens"]))
            n_out = max(1, int(row["GeneratedTokens"]))
            if clip_in:
                n_in = min(n_in, clip_in)
            if clip_out:
                n_out = min(n_out, clip_out)
            jobs.append(Job([rng.randrange(token_range) for _ in range(n_in)], n_out, ts - t0))
    if not jobs:
        raise SystemExit(f"loadgen: no rows in {path}")
    return jobs


def _parse_ts(text: str) -> float:
    from datetime import datetime

    text = text.strip()
    if text.replace(".", "", 1).isdigit():  # already seconds
        return float(text)
    head, _, frac = text.partition(".")
    dt = datetime.strptime(head, "%Y-%m-%d %H:%M:%S")
    return dt.timestamp() + (float("0." + frac.rstrip("0") or "0") if frac else 0.0)


def random_jobs(n: int, in_len: int, out_len: int, range_ratio: float, token_range: int,
                seed: int) -> list[Job]:
    rng = random.Random(seed)

    def draw(mean: int) -> int:
        lo, hi = max(1, int(mean * (1 - range_ratio))), max(1, int(mean * (1 + range_ratio)))
        return rng.randint(lo, hi)

    return [Job([rng.randrange(token_range) for _ in range(draw(in_len))], draw(out_len))
            for _ in range(n)]


def arrival_times(jobs: list[Job], rate: float, burstiness: float, seed: int,
                  replay: bool, scale: float) -> list[float]:
    """Offsets (s) of each request: original gaps (scaled) with --replay-timestamps, else
    gamma gaps (shape = burstiness; 1 = Poisson) normalised so N requests span N / rate."""
    if replay:
        return [j.timestamp * scale for j in jobs]
    if math.isinf(rate):
        return [0.0] * len(jobs)
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)
    gaps = [rng.gammavariate(burstiness, theta) for _ in jobs]
    total = sum(gaps)
    norm = (len(jobs) / rate) / total if total > 0 else 0.0
    out, t = [], 0.0
    for g in gaps:
        out.append(t)
        t += g * norm
    return out


@dataclass
class Result:
    ok: bool = False
    error: str = ""
    input_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    e2e: float = 0.0
    start: float = 0.0


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    k = (len(s) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(results: list[Result], duration: float, detailed: bool) -> dict:
    done = [r for r in results if r.ok]
    out_tokens = [r.output_tokens for r in done]
    tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    itls = [g for r in done for g in r.itl]
    norm = [r.e2e / r.output_tokens for r in done if r.output_tokens]
    total_in = sum(r.input_len for r in done)
    total_out = sum(out_tokens)
    res = {
        "completed": len(done), "failed": len(results) - len(done), "duration": duration,
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(done) / duration if duration else 0.0,
        "output_throughput": total_out / duration if duration else 0.0,
        "total_token_throughput": (total_in + total_out) / duration if duration else 0.0,
    }
    for name, xs in (("ttft_ms", [r.ttft for r in done]), ("tpot_ms", tpots),
                     ("itl_ms", itls), ("e2el_ms", [r.e2e for r in done])):
        ms = [x * 1e3 for x in xs]
        res[f"mean_{name}"] = statistics.fmean(ms) if ms else 0.0
        res[f"median_{name}"] = statistics.median(ms) if ms else 0.0
        res[f"std_{name}"] = statistics.pstdev(ms) if ms else 0.0
        res[f"p99_{name}"] = _pct(ms, 99)
    res["mean_normalized_latency_s"] = statistics.fmean(norm) if norm else 0.0
    res["p99_normalized_latency_s"] = _pct(norm, 99)
    if detailed:
        res.update({"input_lens": [r.input_len for r in results],
                    "output_lens": [r.output_tokens for r in results],
                    "ttfts": [r.ttft for r in results], "itls": [r.itl for r in results],
                    "e2els": [r.e2e for r in results], "errors": [r.error for r in results]})
    return res


def sustainable_rate(rates: list[float], values: list[float], target: float) -> float | None:
    """The highest rate at which the metric is still <= target: the crossing of the target
    with the segment joining two adjacent measured points (linear interpolation). None when
    the target is not crossed inside the sweep: never extrapolated."""
    pts = sorted(zip(rates, values))
    if not pts or pts[0][1] > target:
        return None
    for (r0, v0), (r1, v1) in itertools.pairwise(pts):
        if v0 <= target < v1:
            return r0 + (target - v0) * (r1 - r0) / (v1 - v0)
    return None  # never crossed inside the sweep: the rate lies beyond it




def sweep_targets(runs: list[dict], factor: float) -> dict[str, float]:
    """Latency targets for a sweep: ``factor`` x the first run's values (the unloaded
    reference: gpu-only at the lowest rate, in bench/compare_policies.py)."""
    ref = runs[0]
    return {m: factor * ref[m] for m in ("mean_normalized_latency_s", "p99_ttft_ms",
                                         "p99_itl_ms")}


def sweep_summary(runs: list[dict], targets: dict[str, float]) -> dict:
    """Per policy: the sustainable rate at each target (never extrapolated) and the
    per-rate tails, keyed by rate."""
    rates = [r["request_rate"] for r in runs]

    def per_rate(metric: str, digits: int) -> dict:
        return {str(r["request_rate"]): round(r[metric], digits) for r in runs}

    return {
        "sustainable_rate": sustainable_rate(
            rates, [r["mean_normalized_latency_s"] for r in runs],
            targets["mean_normalized_latency_s"]),
        "sustainable_rate_p99_ttft": sustainable_rate(
            rates, [r["p99_ttft_ms"] for r in runs], targets["p99_ttft_ms"]),
        "sustainable_rate_p99_itl": sustainable_rate(
            rates, [r["p99_itl_ms"] for r in runs], targets["p99_itl_ms"]),
        "mean_normalized_latency_s": per_rate("mean_normalized_latency_s", 4),
        "p99_ttft_ms": per_rate("p99_ttft_ms", 1),
        "p99_itl_ms": per_rate("p99_itl_ms", 1),
    }
