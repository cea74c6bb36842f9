"""Prometheus metrics of the engine (DESIGN.md §Public interfaces). Rendered as text for
``/metrics`` and flattened to ``{sample name with labels: value}`` for ``LLM.metrics()``."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable

# Fine below 100 ms: a CPU tier's and a fast GPU's inter-token latencies live there, and a
# quantile read from the histogram is only as good as the bucket it falls in (with 1-5-10 ms
# edges every P99 between 2 and 5 ms read as "5").
LATENCY_BUCKETS = (0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.01, 0.0125, 0.015, 0.02,
                   0.025, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
                   0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)

_HELP = {
    "dualpace:num_requests_running": ("gauge", "Requests in a running batch, per engine."),
    "dualpace:num_requests_waiting": ("gauge", "Requests waiting for an engine."),
    "dualpace:num_requests_waiting_by_engine": (
        "gauge", "Requests waiting, per engine: gpu = prompts not yet prefilled, cpu = "
        "host-resident requests outside the CPU batch; sums to num_requests_waiting."),
    "dualpace:kv_blocks_used": ("gauge", "KV blocks in use, per tier."),
    "dualpace:kv_blocks_total": ("gauge", "KV blocks in the pool, per tier."),
    "dualpace:generation_tokens_total": ("counter", "Generated tokens, per engine."),
    "dualpace:prompt_tokens_total": ("counter", "Prompt tokens prefilled."),
    "dualpace:dense_assist_calls_total": ("counter", "Dense Assist calls, per route."),
    "dualpace:kv_migrations_total": ("counter", "KV migrations, per kind."),
    "dualpace:async_scheduled_steps_total": (
        "counter", "GPU decode steps submitted before their predecessor's result was "
        "applied (async scheduling)."),
    "dualpace:async_dropped_tokens_total": (
        "counter", "Tokens a step sampled for a request that had finished meanwhile (with "
        "async scheduling: by a stop token or an abort in the step before), dropped."),
    "dualpace:request_success_total": ("counter", "Finished requests, per finish reason."),
    "dualpace:cpu_tier_longest_stall_seconds": (
        "gauge", "Longest CPU-tier stall since the previous scrape (reset on read), a stall "
        "still open included."),
    "dualpace:time_to_first_token_seconds": ("histogram", "Time to first token."),
    "dualpace:inter_token_latency_seconds": ("histogram", "Time between two tokens."),
    "dualpace:e2e_request_latency_seconds": ("histogram", "End-to-end request latency."),
    "dualpace:cpu_tier_stall_seconds": (
        "histogram", "Gaps between consecutive CPU-tier token emissions, counted only while a "
        "CPU-resident request was decode-ready (paper Figure 1)."),
}


def _key(labels: dict[str, str]) -> tuple:
    """Labels as a dict key: one label (the engine's per-token calls) needs no sort."""
    if len(labels) < 2:
        return tuple(labels.items())
    return tuple(sorted(labels.items()))


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


class Histogram:
    def __init__(self, buckets=LATENCY_BUCKETS):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.sum += v
        self.count += 1

    def samples(self, name: str) -> dict[str, float]:
        out, acc = {}, 0
        for le, c in zip(self.buckets, self.counts):
            acc += c
            out[f'{name}_bucket{{le="{le}"}}'] = float(acc)
        out[f'{name}_bucket{{le="+Inf"}}'] = float(self.count)
        out[f"{name}_sum"] = self.sum
        out[f"{name}_count"] = float(self.count)
        return out


class Metrics:
    def __init__(self):
        self.counters: dict[tuple[str, tuple], float] = defaultdict(float)
        self.gauges: dict[tuple[str, tuple], float] = {}
        self.histograms = {n: Histogram() for n, (kind, _) in _HELP.items()
                           if kind == "histogram"}
        # Called before every read with ``close_windows``: gauges whose value is computed at
        # read time (a per-scrape-window maximum) set themselves here.
        self.collectors: list[Callable[[bool], None]] = []

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        self.counters[(name, _key(labels))] += value

    def set(self, name: str, value: float, **labels: str) -> None:
        self.gauges[(name, _key(labels))] = float(value)

    def observe(self, name: str, value: float) -> None:
        self.histograms[name].observe(value)

    def samples(self, close_windows: bool = True) -> dict[str, float]:
        """Every sample. A read closes the per-scrape windows unless ``close_windows`` is
        False (the dashboard peeks, so it does not steal Prometheus's window)."""
        for collect in self.collectors:
            collect(close_windows)
        out: dict[str, float] = {}
        for (name, labels), v in list(self.gauges.items()) + list(self.counters.items()):
            out[name + _labels(dict(labels))] = v
        for name, h in self.histograms.items():
            out.update(h.samples(name))
        return out

    def render(self, close_windows: bool = True) -> str:
        """Prometheus text exposition format."""
        samples = self.samples(close_windows)
        lines = []
        for name, (kind, help_text) in _HELP.items():
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            for key, v in samples.items():
                base = key.split("{", 1)[0]
                if base == name or (kind == "histogram" and base.startswith(name + "_")):
                    lines.append(f"{key} {v}")
        return "\n".join(lines) + "\n"


def histogram_quantile(q: float, name: str, now: dict[str, float],
                       before: dict[str, float] | None = None) -> float | None:
    """Prometheus's histogram_quantile of histogram ``name`` over the increase between two
    scrapes (``before`` None: since start): the bucket holding rank q*count, linear inside
    it; a rank in +Inf answers the largest finite bound; None when nothing was observed."""
    prefix = name + '_bucket{le="'
    buckets = sorted((float("inf") if k[len(prefix):-2] == "+Inf" else float(k[len(prefix):-2]),
                      v - (before or {}).get(k, 0.0)) for k, v in now.items()
                     if k.startswith(prefix))
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank, prev_le, prev_c = q * buckets[-1][1], 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le
