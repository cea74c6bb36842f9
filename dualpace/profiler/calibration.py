"""Appendix B: from serving-shaped measurements to the route components of Eq. 7-8. Pure
Python (the profiler runs the measurements; these turn them into numbers).

- ``profiled_latency`` — Eq. 10-11: per repeat j, the critical path over the ranks Q_x of
  I timed invocations, ℓ_{x,j}(b) = max_q (τ^end − τ^start) / I; M_x(b) = mean_j ℓ_{x,j}(b).
- ``calibration_constants`` — Eq. 12-13: calls grouped by their batch-size row u;
  Q_{x,u} = mean_i [W − G]_+ (the CPU-visible non-CUDA wait: publication, visibility, the
  stage-boundary wait), O_{x,u} = mean_i (L + F) (the GPU worker's launch and finalization);
  q_x = mean_u Q_{x,u}, o_x = mean_u O_{x,u} — groups weigh equally, so the calibration
  workload's batch-size mix is no routing prior.
- ``assist_terms`` — Eq. 14: w_x(b) = q_x + g_x(b), d_x(b) = o_x + g_x(b).
- ``components`` — Eq. 15: t̄_p = a_w + w_p + a_r, t̄_lS = h_w + w_lS, t̄_lA = a_w + w_lA,
  with the Eq. 8 disturbances d_p, d_lS, d_lA.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from dualpace.profiler.fitting import Components

PATHS = ("p", "lS", "lA")  # non-final post-attn, Split-Final post-layer, Fused-Assist final


def profiled_latency(totals: Sequence[Sequence[float]], iters: int) -> float:
    """Eq. 10-11. ``totals[j][q]``: wall (CPU) or CUDA (GPU) time of repeat j's ``iters``
    invocations on rank q."""
    if not totals or any(not row for row in totals) or iters < 1:
        raise ValueError("profiled_latency: need R >= 1 repeats of >= 1 rank, I >= 1")
    return sum(max(row) / iters for row in totals) / len(totals)


@dataclass(frozen=True)
class CalibrationCall:
    """One calibration call of an assist path: its batch-size row u, the CPU-visible wait W,
    and the GPU worker's CUDA execution G, launch L and finalization F (seconds)."""

    rows: int
    wait: float
    cuda: float
    launch: float
    finalize: float


def calibration_constants(calls: Sequence[CalibrationCall]) -> tuple[float, float]:
    """Eq. 12-13: (q_x, o_x) for one path."""
    groups: dict[int, list[CalibrationCall]] = defaultdict(list)
    for c in calls:
        groups[c.rows].append(c)
    if not groups:
        raise ValueError("calibration_constants: no calibration calls")
    q_u = [sum(max(c.wait - c.cuda, 0.0) for c in g) / len(g) for g in groups.values()]
    o_u = [sum(c.launch + c.finalize for c in g) / len(g) for g in groups.values()]
    return sum(q_u) / len(q_u), sum(o_u) / len(o_u)


def assist_terms(q: float, o: float, g: float) -> tuple[float, float]:
    """Eq. 14: (w_x(b), d_x(b)) from the constants and the batch-dependent CUDA latency."""
    return q + g, o + g


def components(t_p: float, t_l: float, a_w: float, a_r: float, h_w: float,
               w: dict[str, float], d: dict[str, float]) -> Components:
    """Eq. 15 into the score inputs of Eq. 7-8 (``w``/``d`` keyed by PATHS)."""
    return Components(t_p=t_p, t_l=t_l, w_p=a_w + w["p"] + a_r, w_lS=h_w + w["lS"],
                      w_lA=a_w + w["lA"], d_p=d["p"], d_lS=d["lS"], d_lA=d["lA"])
