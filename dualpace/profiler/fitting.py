"""The offline profiler's decision rules (paper §4.3, Appendix B, Algorithm 1). Pure Python:
they turn measured latency/throughput curves into the serving controls.

- ``route_scores``: S_r(b) = T_r^CPU(b) + λ_GPU D_r^GPU(b) for the three routes (Eq. 6-8).
- ``choose_thresholds``: Algorithm 1 — every legal (P, F), mean score over the profiled batch
  sizes, the candidates within (1 + ε) of the best, fewest average assist calls, then the
  lowest score, P and F.
- ``pava``: isotonic (non-decreasing) least-squares fit (pool adjacent violators).
- ``plateau_limit``: the GPU batched-token limit — the plateau is the mean of the last K
  fitted points; the limit is the earliest token count within δ of it.
- ``peak_batch``: the CPU decode batch limit — the throughput-maximising batch size.
"""

from __future__ import annotations

from dataclasses import dataclass

from dualpace.runtime.routing import (
    FULL_CPU,
    FUSED_ASSIST,
    SPLIT_FINAL,
    assist_calls,
    route_for,
)


@dataclass(frozen=True)
class Components:
    """Profiled component latencies at one CPU batch size b (seconds).

    t_p: CPU post-attention; t_l: CPU post-layer; w_p: wait-post-attn (assisted);
    w_lS / w_lA: wait-post-layer on the Split-Final / Fused-Assist path; d_p, d_lS, d_lA: the
    matching GPU disturbances (assist execution + launch/finalisation overhead)."""

    t_p: float
    t_l: float
    w_p: float
    w_lS: float
    w_lA: float
    d_p: float
    d_lS: float
    d_lA: float


def route_scores(c: Components, num_layers: int, lam: float = 1.0) -> dict[str, float]:
    """Eq. 6 with Eq. 7 (CPU-visible time) and Eq. 8 (GPU disturbance)."""
    n = num_layers
    t_cpu = {FULL_CPU: n * c.t_p + c.t_l, SPLIT_FINAL: n * c.t_p + c.w_lS,
             FUSED_ASSIST: (n - 1) * c.w_p + c.w_lA}
    d_gpu = {FULL_CPU: 0.0, SPLIT_FINAL: c.d_lS, FUSED_ASSIST: (n - 1) * c.d_p + c.d_lA}
    return {r: t_cpu[r] + lam * d_gpu[r] for r in t_cpu}


def choose_thresholds(scores: dict[int, dict[str, float]], num_layers: int,
                      eps: float) -> tuple[int, int]:
    """Algorithm 1. ``scores[b][route]`` for every profiled batch size b."""
    sizes = sorted(scores)
    if not sizes:
        raise ValueError("scores: no profiled batch sizes")
    calls = {r: assist_calls(r, num_layers) for r in (FULL_CPU, SPLIT_FINAL, FUSED_ASSIST)}
    cands = [(0, 0)] + [(p, f) for p in sizes for f in [0, *sizes] if f < p]

    def evaluate(pf):
        routes = [route_for(b, *pf) for b in sizes]
        score = sum(scores[b][r] for b, r in zip(sizes, routes)) / len(sizes)
        avg_calls = sum(calls[r] for r in routes) / len(sizes)
        return score, avg_calls

    table = {pf: evaluate(pf) for pf in cands}
    best = min(s for s, _ in table.values())
    near = [pf for pf, (s, _) in table.items() if s <= (1 + eps) * best]
    return min(near, key=lambda pf: (table[pf][1], table[pf][0], pf[0], pf[1]))


def pava(y: list[float], w: list[float] | None = None) -> list[float]:
    """Non-decreasing least-squares fit of ``y`` (weights ``w``): pool adjacent violators."""
    w = w or [1.0] * len(y)
    blocks: list[list[float]] = []  # [weighted mean, weight, count]
    for yi, wi in zip(y, w):
        blocks.append([yi, wi, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for m, _, n in blocks:
        out += [m] * n
    return out


def plateau_limit(tokens: list[int], throughput: list[float], k: int = 5,
                  delta: float = 0.01) -> int:
    """GPU batched-token limit: fit a non-decreasing curve to throughput(tokens), take the
    plateau as the mean of the last ``k`` fitted points, return the earliest token count whose
    fitted throughput is within ``delta`` (relative) of it."""
    if len(tokens) != len(throughput) or not tokens:
        raise ValueError("tokens/throughput: need equally long, non-empty lists")
    order = sorted(range(len(tokens)), key=lambda i: tokens[i])
    xs = [tokens[i] for i in order]
    fit = pava([throughput[i] for i in order])
    tail = fit[-k:]
    plateau = sum(tail) / len(tail)
    return next(x for x, v in zip(xs, fit) if v >= (1 - delta) * plateau)


def peak_batch(batches: list[int], throughput: list[float]) -> int:
    """CPU decode batch limit: the batch size with the highest decode throughput (ties: the
    smaller batch, lower latency)."""
    if len(batches) != len(throughput) or not batches:
        raise ValueError("batches/throughput: need equally long, non-empty lists")
    return min(zip(batches, throughput), key=lambda bt: (-bt[1], bt[0]))[0]
