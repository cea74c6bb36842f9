"""Post-attention routing π_{P,F}(b) of a CPU decode batch (paper §4.2, Eq. 5). No torch."""

from __future__ import annotations

from dualpace.config import check_thresholds, parse_thresholds  # noqa: F401  (re-exported)

FULL_CPU, SPLIT_FINAL, FUSED_ASSIST = "full-cpu", "split-final", "fused-assist"
ROUTES = (FULL_CPU, SPLIT_FINAL, FUSED_ASSIST)
# Not one of Eq. 5's routes: the gated (NEO-style) baseline's CPU step, attention alone on
# the CPU and every dense stage (embedding and QKV included) on the GPU, in two sub-batches.
NEO_PIPELINE = "neo-pipeline"


def route_for(batch_size: int, p: int, f: int) -> str:
    """Eq. 5, read literally: "π(b) = Full-CPU, b ≤ F; Split-Final, F < b ≤ P;
    Fused-Assist, b > P". A batch has b ≥ 1 rows, so (P, F) = (0, 0) makes every batch
    Fused-Assist (that is why it is legal beside 0 ≤ F < P and why Algorithm 1 line 1 adds it
    to Θ). No assist at all is F ≥ C (``no_assist``)."""
    if batch_size <= f:
        return FULL_CPU
    if batch_size <= p:
        return SPLIT_FINAL
    return FUSED_ASSIST


def no_assist(max_cpu_batch: int) -> tuple[int, int]:
    """The legal (P, F) with F = C: every batch the CPU tier can form is Full-CPU (§4.2), the
    default when neither --assist-thresholds nor a profile says otherwise."""
    return max_cpu_batch + 1, max_cpu_batch


def assist_reachable(max_cpu_batch: int, p: int, f: int) -> bool:
    """§4.2: "If C ≤ F (and hence C ≤ P), every reachable batch follows Full-CPU, so Dense
    Assist is statically unreachable": the GPU worker then runs whole forwards without
    stage-boundary assist checks."""
    return max_cpu_batch > f


def assist_calls(route: str, num_layers: int) -> int:
    """Dense Assist calls one CPU decode iteration makes (Algorithm 1's Calls(r))."""
    return {FULL_CPU: 0, SPLIT_FINAL: 1, FUSED_ASSIST: num_layers}[route]
