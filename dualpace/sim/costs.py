"""Per-step cost models for the simulator: seconds for one GPU-main step and one CPU-worker
step, and the GPU time a CPU step's Dense Assist calls take from GPU-main (Eq. 8's
disturbance).

Two sources:

- ``FittedCosts``: linear models fitted to steps the real runtime executed on this box
  (``dualpace serve --step-log``): GPU time over the step's tokens, rows, attended context and
  host-link KV; CPU time per route over batch (two slopes, CPU_BATCH_KNEE) and context.
  Non-negative least squares (a cost never falls as work grows). ``Jittered`` adds the
  measured spread of steps around the fit (``jitter_table``), the tails that P99 latencies
  are made of. Where the two workers share cores, each fit also has a contention term
  (``contention_fit``): the simulated workers then share the cores as the real ones did
  (``slowdown``).
- ``RooflineCosts``: a hardware description (hardware.py) through per-stage roofline
  formulas: each stage takes max(bytes / bandwidth, FLOPs / peak) scaled by an efficiency,
  plus fixed per-step and per-call overheads.
"""

from __future__ import annotations

import base64
import bisect
import itertools
import random
from dataclasses import dataclass, fields
from typing import Protocol

import numpy as np

from dualpace.runtime.routing import FULL_CPU, FUSED_ASSIST, NEO_PIPELINE, SPLIT_FINAL
from dualpace.runtime.step_work import CpuStepWork, GpuStepWork
from dualpace.sim.hardware import Hardware
from dualpace.sim.shape import ModelShape

MIN_SPLIT = 50  # steps each side needs before GPU steps are fitted alone / beside the CPU
JITTER_QUANTILES = 100  # the measured spread of step times around the fit, as this many quantiles
JITTER_BINS = 4  # ... per this many bins of step size (quantiles of it)
JITTER_SPAN = 2.0  # ... and a bin wider than this factor of sizes is split where it can be
JITTER_MIN_BIN = JITTER_QUANTILES  # steps each side of such a split needs
JITTER_SPELL = 100  # mean run of consecutive measured steps whose ranks the draws replay
GPU_FEATURES = ("prefill_tokens", "decode_rows", "context", "prefill_context", "link_tokens",
                "carried_rows", "prefill_step")
# A CPU step's rows are priced on two slopes: "batch" up to CPU_BATCH_KNEE rows, then
# "batch_past_knee". Measured on the 2-core Zen 5 (two 200-request sweeps at 2-16 req/s,
# 146,601 Full-CPU steps), a step's mean time less its context term grew ~0.33 ms from 1 to
# 2 rows, ~0.25 ms to 3 and ~0.12 ms a row from 3 to 13; one slope fitted to a log of
# mostly 1-2-row steps priced 12 rows at 4.6 ms against 2.8 measured, and the simulated CPU
# tier then ran ever larger, slower batches (2x the real P99 inter-token latency at 12-16
# req/s). With the knee at 3 and plain least squares (fit_step_costs) every batch size from
# 1 to 11 rows averages within 6% of its fit; at 4, rows 2-3 come out 4-6% cheap and 4 5%
# dear. Each fitted CPU route records its knee ("batch_knee") and is priced at it: a
# profile fitted before the knee moved to 3 has "batch_past_knee" without it and was fitted
# at 4 (LEGACY_BATCH_KNEE); one without the second slope (format 2 before it) prices every
# row at "batch", as it was fitted. The context term is the attention fit's
# (fit_step_costs).
CPU_BATCH_KNEE = 3
LEGACY_BATCH_KNEE = 4
CPU_FEATURES = ("batch", "batch_past_knee", "context")
OVERLAP = "overlap"  # seconds of a step during which the other worker group ran a step
MAX_LOST = 0.9  # the contention term's ceiling: a step beside the other keeps 10% of its pace


@dataclass(frozen=True)
class AssistCall:
    """One Dense Assist call of a CPU step, in step order (§4.2)."""

    before: float  # CPU-local seconds of the step since the previous call (or the start)
    wait: float  # CPU-visible service once GPU-main takes it: GPU time + the activations' trip
    gpu: float  # GPU-main time it takes (Eq. 8's d_x: execution + launch/finalisation)


@dataclass(frozen=True)
class CpuStepCost:
    seconds: float  # the CPU step, as the CPU engine waits for it (no stage-boundary wait)
    attention: float  # its attention part (what the gated policy's Eq. 1 observes)
    gpu_disturbance: float  # GPU-main time its Dense Assist calls take (Eq. 8)
    # Its assist calls, where the cost model leaves the stage-boundary wait to the workers
    # (``boundary_waits``): seconds = sum(before + wait) + what runs after the last call.
    calls: tuple[AssistCall, ...] = ()


class CostModel(Protocol):
    """What the simulated workers ask of a cost model (FittedCosts, RooflineCosts, or a
    test's own)."""

    def gpu_step(self, w: GpuStepWork, beside: bool = False) -> float:
        """Seconds of one GPU-main step; ``beside``: the CPU worker runs a step meanwhile
        (older fits price such steps apart; fits with a contention term price the step
        alone, and the workers stretch its overlapped part by ``slowdown``)."""

    def cpu_step(self, w: CpuStepWork) -> CpuStepCost:
        """One CPU-worker step: its seconds, its attention part and its Dense Assist
        calls' GPU-main time."""

    def slowdown(self, kind: str, route: str = "") -> float:
        """How many times slower a ``kind`` ("gpu" or "cpu"; ``route``: the CPU step's)
        step progresses while the other group runs a step: 1 where they do not contend."""

    # Optional ``boundary_waits`` (a class attribute): True where a CPU step's Dense Assist
    # calls (``CpuStepCost.calls``) must wait for GPU-main's next stage boundary, which the
    # simulated workers then model call by call. Fitted costs leave it unset: the steps they
    # were fitted to already waited.


# --- fitted from the real runtime's step log ---------------------------------------------------
def nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: solve, drop the most negative coefficient,
    repeat (the columns here are few; Lawson-Hanson would give the same on them)."""
    active = list(range(x.shape[1]))
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            return coef
        active.pop(int(np.argmin(sol)))
    return coef


def _relative(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows scaled by 1/sqrt(y), between absolute and relative error: plain least squares
    lets the few long prefill steps' residuals dominate and overestimates the many short
    decode steps (gpu-only at a low rate came out 75% slow); fully relative error
    underestimates the long steps (the total GPU time fell 13% short). On this box's
    compare_policies log this weighting keeps the total within 8% and the median step
    within 19%."""
    w = 1.0 / np.sqrt(np.maximum(y, 1e-6))
    return x * w[:, None], y * w


def fit_total_preserving(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The weighted fit (``_relative``), rescaled so that its predictions sum to the measured
    total. The weighting sets the shape (how cost grows with each feature); the scale makes
    the total busy time, which bounds the sustainable rate, exact on the log: the weighted fit
    alone came out 6-24% short of it per worker after the native stages made steps cheaper
    and more uniform, and a simulation that short is that much optimistic."""
    coef = nnls(*_relative(x, y))
    pred = float((x @ coef).sum())
    return coef * (float(y.sum()) / pred) if pred > 0 else coef


def _feature(record: dict, name: str) -> float:
    if name == "prefill_step":
        return float(record["prefill_tokens"] > 0)
    if name in ("batch", "batch_past_knee"):  # CPU records: the rows on two slopes
        below = min(record["batch"], CPU_BATCH_KNEE)
        return below if name == "batch" else record["batch"] - below
    return record[name]


def cpu_linear(c: dict, batch: int, context: int) -> float:
    """A CPU fit's seconds for a step of ``batch`` rows over ``context`` tokens: the
    overhead, the rows on their two slopes (CPU_FEATURES) split at the knee the fit was made
    with (``batch_knee``; LEGACY_BATCH_KNEE for profiles written before it was recorded),
    the context."""
    below = min(batch, int(c.get("batch_knee", LEGACY_BATCH_KNEE)))
    return (c["overhead"] + c["batch"] * below
            + c.get("batch_past_knee", c["batch"]) * (batch - below) + c["context"] * context)


def contention_fit(samples: list[dict]) -> bool:
    """Whether a log can say how the two workers slowed each other down: every step records
    its ``overlap`` (older logs only say ``beside``), and none belongs to the gated pipeline,
    whose halves wait for each other every layer by design (its GPU step's fit counts the
    carried rows and the simulated workers model the waits; a contention term on top would
    count them twice)."""
    measured = all(OVERLAP in s and "step_seconds" in s for s in samples)
    return bool(samples) and measured and not any(
        s.get("carried_rows") or s.get("route") == NEO_PIPELINE for s in samples)


def overlap_fraction(record: dict) -> float:
    """The share of a step's worker round trip during which the other group ran a step."""
    if record["step_seconds"] <= 0:
        return 0.0
    return min(1.0, record[OVERLAP] / record["step_seconds"])


def _weighted_sse(x: np.ndarray, y: np.ndarray, coef: np.ndarray) -> float:
    xw, yw = _relative(x, y)
    return float(((yw - xw @ coef) ** 2).sum())


def fit_contended(x: np.ndarray, y: np.ndarray, frac: np.ndarray,
                  weighted: bool = True) -> tuple[np.ndarray, float]:
    """(coefficients of W, c) for ``y = (x @ coef) / (1 - c frac)``: a step that spent the
    share ``frac`` of its time beside the other group's steps at 1/s of its pace, W its time
    alone, took ``T`` with ``W = T (1 - frac) + T frac / s``, i.e. ``T = W / (1 - c frac)``,
    ``c = 1 - 1/s`` the fraction of pace lost. For a given c the model is linear in W's
    coefficients (``fit_total_preserving`` on the features stretched by 1 / (1 - c frac));
    c is the one of least weighted error, over a grid of 0.05 and then a golden-section
    search around its best point. ``weighted=False``: plain least squares (``nnls``) and
    plain squared error instead, as CPU steps are fitted (fit_step_costs).

    Why not ``T = W + c x overlap``, linear in the overlap seconds: a step that runs long
    for any reason (an interrupt, a stolen core) overlaps the other group for longer, so the
    regressor grows with the step's own noise and its coefficient comes out too high: 0.58
    (s = 2.4) on a noisy day's log, where the share, which that noise leaves alone, gives
    0.35 for GPU steps and 0.2 for CPU steps, and the simulated ITL came out 2x the real
    one."""
    def fit(c: float) -> tuple[float, np.ndarray]:
        xs = x / (1.0 - c * frac)[:, None]
        if not weighted:
            coef = nnls(xs, y)
            return float(((y - xs @ coef) ** 2).sum()), coef
        coef = fit_total_preserving(xs, y)
        return _weighted_sse(xs, y, coef), coef

    def sse(c: float) -> float:
        return fit(c)[0]

    best = float(min(np.linspace(0.0, MAX_LOST, round(MAX_LOST / 0.05) + 1), key=sse))
    lo, hi = max(0.0, best - 0.05), min(MAX_LOST, best + 0.05)
    golden = (5 ** 0.5 - 1) / 2
    a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
    fa, fb = sse(a), sse(b)
    for _ in range(40):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - golden * (hi - lo)
            fa = sse(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + golden * (hi - lo)
            fb = sse(b)
    searched, best_fit = (lo + hi) / 2, fit(best)
    searched_fit = fit(searched)
    # the grid point wins where the optimum sits on an edge of the range
    return (best_fit[1], best) if best_fit[0] < searched_fit[0] else (searched_fit[1], searched)


def fit_step_costs(samples: list[dict], contention: bool = False) -> dict:
    """Coefficients for ``FittedCosts`` from step-log records ({"kind": "gpu"|"cpu",
    "seconds", features...}): GPU steps weighted (``fit_total_preserving``), CPU steps by
    plain least squares (see below). The intercept is the step's fixed overhead.

    ``contention`` (and ``contention_fit``): each fit also has ``overlap``, the fraction c of
    pace a step loses while the other group runs one (``fit_contended``;
    ``FittedCosts.slowdown`` turns it into s = 1 / (1 - c)); its other coefficients are then
    the step's time alone. Otherwise GPU steps run beside a CPU step are fitted apart from
    those run alone (``gpu_beside``) and CPU steps pooled.

    Contention is opt-in: on this box's two noisy-day validations (4 real sweeps each, 4
    jitter seeds) the contended model came out 5-16% pessimistic on dualpace's sustainable
    rate, the default one within 13% (mean error 5% against 10%), though only the contended
    one models a CPU step alone running ~0.7x and beside a GPU step ~1.25x the pooled fit."""
    out: dict = {"gpu": None, "cpu": {}}
    contention = contention and contention_fit(samples)

    def fit(rows: list[dict], features: tuple[str, ...], y: np.ndarray,
            contended: bool = contention, weighted: bool = True
            ) -> tuple[dict, np.ndarray, np.ndarray]:
        """Coefficients by name, each row's prediction, and its prediction alone (what the
        simulated workers price a step by, and so what its jitter is looked up by).
        ``weighted``: ``fit_total_preserving``; else plain least squares (``nnls``), with
        or without the contention term."""
        x = np.array([[1.0, *(_feature(s, f) for f in features)] for s in rows])
        if not contended:
            coef = fit_total_preserving(x, y) if weighted else nnls(x, y)
            return dict(zip(("overhead", *features), coef.tolist())), x @ coef, x @ coef
        frac = np.array([overlap_fraction(s) for s in rows])
        coef, c = fit_contended(x, y, frac, weighted)
        return ({**dict(zip(("overhead", *features), coef.tolist())), OVERLAP: c},
                (x @ coef) / (1.0 - c * frac), x @ coef)

    def fit_gpu(rows: list[dict]) -> dict:
        y = np.array([s["seconds"] for s in rows])
        coefs, pred, size = fit(rows, GPU_FEATURES, y)
        alone = np.array([s["carried_rows"] == 0 for s in rows])  # see Jittered.gpu_step
        return {**coefs, "samples": len(rows),
                "jitter": jitter_table(y[alone], pred[alone], size[alone])}

    gpu = [s for s in samples if s["kind"] == "gpu"]
    if gpu:
        out["gpu"] = fit_gpu(gpu)
        alone = [s for s in gpu if not s.get("beside")]
        beside = [s for s in gpu if s.get("beside")]
        if not contention and len(alone) >= MIN_SPLIT and len(beside) >= MIN_SPLIT:
            out["gpu"] = fit_gpu(alone)
            out["gpu_beside"] = fit_gpu(beside)
    # CPU steps are fitted by plain least squares, to each batch size's mean: they are all
    # decode steps of one kind (0.5-5 ms here), without the few long prefills that the
    # weighting (_relative) keeps from dominating a GPU fit. Weighted, the fit followed the
    # short steps' medians, below their means (a 1-row step's right tail is the longest,
    # 4.4x at the 99th percentile), and the rescale to the total then priced every batch
    # of 4-13 rows 5-15% dear: the simulated CPU tier fell behind and ran larger batches
    # than the real one (P99 inter-token latency +44% / +83% at 12 / 16 req/s; plain: see
    # JITTER_SPAN for the rest of that gap).
    routes = sorted({s["route"] for s in samples if s["kind"] == "cpu"})
    for route in routes:
        rows = [s for s in samples if s["kind"] == "cpu" and s["route"] == route]
        y = np.array([s["seconds"] for s in rows])
        # the attention part feeds the gated baseline's Eq. 1, and gated logs are never
        # fitted with contention: a plain fit, without a search for a factor nothing reads
        att = fit(rows, CPU_FEATURES, np.array([s.get("attention", 0.0) for s in rows]),
                  contended=False)[0]
        if att["context"] > 0 and not contention:
            # Context priced as the worker's own attention timings price it: with the rows
            # and the context growing together (a batch of 8 reads ~8x the tokens), a free
            # context term took cost that belongs to the rows (0.143 us a token against the
            # 0.083 measured); the rest is fitted over the rows alone.
            ctx = att["context"] * np.array([s["context"] for s in rows])
            coefs, pred, size = fit(rows, ("batch", "batch_past_knee"), y - ctx,
                                    weighted=False)
            coefs["context"] = att["context"]
            pred, size = pred + ctx, size + ctx
        else:
            coefs, pred, size = fit(rows, CPU_FEATURES, y, weighted=False)
        att["batch_knee"] = coefs["batch_knee"] = CPU_BATCH_KNEE  # what cpu_linear splits at
        out["cpu"][route] = {**coefs, "attention": att, "samples": len(rows),
                             "jitter": jitter_table(y, pred, size)}
    return out


def jitter_table(actual: np.ndarray, predicted: np.ndarray,
                 size: np.ndarray | None = None) -> dict:
    """How measured steps spread around the fit, by step size: the steps split into
    ``JITTER_BINS`` bins at quantiles of their ``size`` (default: their predicted seconds;
    with a contention term, the prediction alone, which is what a simulated step is priced
    and looked up by), a bin wider than ``JITTER_SPAN`` split further where it has the
    steps for it (``_split_wide_bins``) (``edges``), and per bin
    ``JITTER_QUANTILES`` evenly spaced quantiles (midpoints; measured values, never
    interpolated) of actual / predicted seconds, divided by their mean so that a draw keeps
    the bin's expected total (``tables``).

    On this box a step's time has a right tail that no feature explains (core sharing,
    interrupts, the allocator): a decode step's 99th percentile is 2x its prediction, a P99
    inter-token latency is made of that tail, and without it the simulated P99 sat at the
    median step. The tail is relatively longer for short steps (a one-row CPU step 2.8x at
    the 99th percentile, a 16-row one 1.8x), hence the bins: one table for all sizes put
    the short steps' tail on the long ones.

    ``ranks``: each step's place in its own bin's table (0 .. JITTER_QUANTILES - 1), in the
    order of ``actual`` (the step log's order: time). Slow steps come in spells on this box
    (the rank's autocorrelation is 0.5-0.6 at the next step and ~0.3 twenty steps on: a
    stolen core, a neighbour's burst), and a whole sweep can be noisier than the next; the
    simulated workers replay these ranks in order (``Jittered``) so that their slow steps
    come in spells too, rather than spread evenly over every simulated point."""
    size = predicted if size is None else size
    ok = predicted > 0
    if ok.sum() < JITTER_BINS * 10:
        return {"edges": [], "tables": [[1.0]]}
    ratio, size = actual[ok] / predicted[ok], size[ok]
    edges = _split_wide_bins(size, np.unique(np.quantile(size, np.arange(1, JITTER_BINS)
                                                         / JITTER_BINS)))
    which = np.searchsorted(edges, size, side="right")
    mid = (np.arange(JITTER_QUANTILES) + 0.5) / JITTER_QUANTILES
    tables = []
    ranks = np.zeros(len(ratio), dtype=np.int64)
    for b in range(len(edges) + 1):
        in_bin = which == b
        q = (np.quantile(ratio[in_bin], mid, method="inverted_cdf") if in_bin.any()
             else np.ones(1))
        tables.append((q / q.mean()).round(4).tolist() if q.mean() > 0 else [1.0])
        # the step at ascending position k of n sits in the table's (k + 0.5) / n quantile
        order = np.argsort(ratio[in_bin], kind="stable")
        place = np.empty(len(order), dtype=np.int64)
        place[order] = np.arange(len(order))
        ranks[in_bin] = np.minimum(((place + 0.5) / max(len(order), 1) * len(q)).astype(np.int64),
                                   len(q) - 1)
    return {"edges": edges.tolist(), "tables": tables, "ranks": encode_ranks(ranks)}


def _split_wide_bins(size: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """``edges`` plus a cut at the geometric middle of every bin whose sizes span more than
    ``JITTER_SPAN``, where both halves keep ``JITTER_MIN_BIN`` steps (again within each
    half). Why: most logged steps are decodes of nearly one size, so the quantile edges all
    fall among them and the top bin held every prefill step with the multi-row decodes; a
    25 ms prefill then drew a decode's tail (this box, 2026-12-02: 7.6x at the 99th
    percentile of that bin's short steps, 2.3x of its prefills), which made the simulated
    P99 TTFT 1.4-2.7x the real one.

    The span is 2, not 4: most CPU steps are 1-row decodes (~0.7 ms), so three quantile
    edges fell among them and one bin held every step from 1.1 ms (2 rows) to 4 ms (13
    rows), two thirds of them 2-3-row steps whose tail (3.5x / 2.9x their fit at the 99th
    percentile) is longer than a 9-13-row step's (1.8x). Drawn from that bin, the large
    batches' slow steps came out too slow, and at 12-16 req/s, where the CPU tier runs them,
    dualpace's simulated P99 inter-token latency stayed 19-40% above the real one with the
    fit right on average; split at 2x (cuts at 1.1 and 2.0 ms) it came within -11% to +6% at
    2-16 req/s (8 jitter seeds)."""
    out = list(edges)

    def split(lo: float, hi: float) -> None:
        inside = size[(size >= lo) & (size < hi)]
        if len(inside) < 2 * JITTER_MIN_BIN or inside.max() <= JITTER_SPAN * inside.min():
            return
        cut = float(np.sqrt(inside.min() * inside.max()))
        below = int((inside < cut).sum())
        if below < JITTER_MIN_BIN or len(inside) - below < JITTER_MIN_BIN:
            return
        out.append(cut)
        split(lo, cut)
        split(cut, hi)

    bounds = [-np.inf, *edges, np.inf]
    for lo, hi in itertools.pairwise(bounds):
        split(lo, hi)
    return np.unique(np.array(out, dtype=float))


def encode_ranks(ranks) -> str:
    """A jitter table's ``ranks`` as stored in a profile: one byte a step, base64 (a JSON
    list took 8 MB a profile for four sweeps' ~300,000 steps)."""
    return base64.b64encode(np.asarray(ranks, dtype=np.uint8).tobytes()).decode("ascii")


def decode_ranks(jitter: dict) -> bytes:
    """The ``ranks`` of a jitter table (``encode_ranks``), one byte a measured step; empty
    for tables without them (profiles written before they existed)."""
    return base64.b64decode(jitter.get("ranks") or "")


class Jittered:
    """A fitted cost model whose every step takes its prediction times a draw from the step's
    measured jitter table (``jitter_table``), from a seeded generator: the same seed, the same
    run. Fits without tables (older profiles) draw 1.

    Which entry of the step's table: where the fit has the measured steps' ``ranks``, the
    draws walk along them in log order, one measured step per simulated one, from a random
    place, and jump to another random place with probability 1 / ``JITTER_SPELL`` per step
    (a stationary block bootstrap, Politis & Romano 1994: every measured step is equally
    likely in the long run, so each bin's mean is kept, and slow spells last as long as
    measured). Each kind of step (GPU alone, GPU beside, each CPU route) walks its own log.
    Profiles without ranks draw each step's entry independently.

    Measured on this box (4 sets of 4 real sweeps, one of them also as its quiet points
    alone, each against 4 seeds; P99s per policy and rate): engine P99 inter-token latencies
    within 20% of the real ones at 43 of 75 points with the walk, 31 with independent draws,
    which spread the noisiest sweep's tail over every simulated point (dualpace's came out
    28-51% high); but P99 TTFT within 20% at 43
    against 51 (slow spells build queues that the independent draws average away), and
    sustainable rates within 10% equally often (19 of 34 against 19 of 35). Spells of 1,000
    steps did no better on latency and worse on the rates."""

    def __init__(self, costs: FittedCosts, seed: int | str):
        self.costs = costs
        self.rng = random.Random(seed)
        self._at: dict[int, int] = {}  # id(jitter) -> the measured step the walk is at
        self._ranks: dict[int, bytes] = {}  # id(jitter) -> its decoded ranks

    def _draw(self, jitter: dict | None, predicted: float) -> float:
        if not jitter:
            return 1.0
        table = jitter["tables"][bisect.bisect_right(jitter["edges"], predicted)]
        key = id(jitter)
        ranks = self._ranks.get(key)
        if ranks is None:
            ranks = self._ranks[key] = decode_ranks(jitter)
        if not ranks:
            return self.rng.choice(table)
        at = self._at.get(key)
        if at is None or self.rng.random() * JITTER_SPELL < 1.0:
            at = self.rng.randrange(len(ranks))
        else:
            at = (at + 1) % len(ranks)
        self._at[key] = at
        return table[ranks[at] * len(table) // JITTER_QUANTILES]

    def slowdown(self, kind: str, route: str = "") -> float:
        return self.costs.slowdown(kind, route)

    def gpu_step(self, w: GpuStepWork, beside: bool = False) -> float:
        t = self.costs.gpu_step(w, beside)
        if w.carried_rows:  # a gated pipeline step: see cpu_step
            return t
        return t * self._draw(self.costs.gpu_coefs(beside).get("jitter"), t)

    def cpu_step(self, w: CpuStepWork) -> CpuStepCost:
        c = self.costs.cpu_step(w)
        if w.route == NEO_PIPELINE:
            # The gated pipeline's two halves wait for each other every layer: the logged
            # spread of its steps (a CPU step's 99th percentile at 6-10x the fit) is those
            # waits, which the simulated workers model themselves, not noise. Drawn on top,
            # it put gated's simulated P99 inter-token latency 30% above the real one.
            return c
        k = self._draw(self.costs.cpu_coefs(w.route).get("jitter"), c.seconds)
        return CpuStepCost(c.seconds * k, c.attention * k, c.gpu_disturbance * k)


def profile_costs(profile: dict, policy: str, contended: bool = False) -> FittedCosts:
    """A profile's step costs for ``policy``: the ones fitted to that policy's own server
    where the profile has them (``step_costs_by_policy``: on a small box the workers share
    cores, and a GPU step runs ~25% slower beside a busy CPU worker than alone), else the
    pooled fit (``step_costs``). ``contended``: the fits with a contention term
    (``step_costs_contended_by_policy`` / ``step_costs_contended``, fit_step_costs)."""
    key = "step_costs_contended" if contended else "step_costs"
    by_policy = profile.get(f"{key}_by_policy") or {}
    coefs = by_policy.get(policy) or profile.get(key)
    if not coefs:
        if contended:
            raise ValueError("profile: no 'step_costs_contended' (bench/compare_policies.py "
                             "writes them from step logs that record each step's overlap)")
        raise ValueError("profile: no 'step_costs' (write one with bench/compare_policies.py, "
                         "or fit a `serve --step-log` with dualpace.sim.costs.fit_step_costs)")
    return FittedCosts(coefs)


class FittedCosts:
    def __init__(self, coefs: dict):
        if not coefs.get("gpu"):
            raise ValueError("step costs: no GPU steps were fitted")
        self.gpu = coefs["gpu"]
        self.gpu_beside = coefs.get("gpu_beside")
        self.cpu = coefs.get("cpu", {})

    def gpu_coefs(self, beside: bool) -> dict:
        return self.gpu_beside if beside and self.gpu_beside else self.gpu

    def gpu_step(self, w: GpuStepWork, beside: bool = False) -> float:
        c = self.gpu_coefs(beside)
        return c["overhead"] + sum(c[f] * getattr(w, f) for f in GPU_FEATURES)

    def cpu_coefs(self, route: str) -> dict:
        if route in self.cpu:
            return self.cpu[route]
        if FULL_CPU in self.cpu:  # a route the log never saw: its Full-CPU cost
            return self.cpu[FULL_CPU]
        if self.cpu:
            return next(iter(self.cpu.values()))
        raise ValueError("step costs: no CPU steps were fitted")

    def slowdown(self, kind: str, route: str = "") -> float:
        """1 / (1 - the fit's fraction of pace lost while overlapped) (``fit_step_costs``);
        1 for fits without a contention term."""
        c = self.gpu if kind == "gpu" else self.cpu_coefs(route)
        return 1.0 / (1.0 - min(c.get(OVERLAP, 0.0), MAX_LOST))

    def cpu_step(self, w: CpuStepWork) -> CpuStepCost:
        c = self.cpu_coefs(w.route)
        a = c["attention"]
        t = cpu_linear(c, w.batch, w.context)
        att = cpu_linear(a, w.batch, w.context)
        if w.route == NEO_PIPELINE:
            # The gated pipeline's CPU half: its logged time is the whole pipelined step
            # (it waits for the GPU half every layer), and so is the GPU step's that carries
            # it, whose fit counts the carried rows. The engine waits for both, so taking the
            # logged time on both sides would count the step twice over the max of two
            # noisy fits (gated's simulated inter-token latency came out 20-30% above the
            # real one): the CPU half takes its attention, the work it does alone.
            return CpuStepCost(min(att, t), min(att, t), 0.0)
        return CpuStepCost(t, min(att, t), 0.0)


def record_seconds(costs: FittedCosts, record: dict) -> float:
    """The seconds ``costs`` prices a logged step at (a step-log record, as fit_step_costs
    reads it): a GPU step by its work and whether it ran beside a CPU step, a CPU step by
    its batch, context and route. No jitter."""
    if record["kind"] == "gpu":
        w = GpuStepWork(**{f.name: record[f.name] for f in fields(GpuStepWork)})
        return costs.gpu_step(w, bool(record.get("beside")))
    return costs.cpu_step(CpuStepWork(record["batch"], record["context"],
                                      record["route"])).seconds


# --- from a hardware description ---------------------------------------------------------------
class RooflineCosts:
    """Per-stage rooflines (seconds), each formula a method so tests can check it by hand:

    - GPU dense: max(weight bytes / (HBM BW x e_mem), 2 x params x tokens / (FLOP/s x
      e_flops)) over the TP group; decode attention: attended KV bytes / HBM BW; prefill
      attention: 4 x layers x q_size x prefill_context FLOPs; TP all-reduces: 2 per layer
      of tokens x hidden x 2 bytes, ring (2 (g-1)/g) over the GPU interconnect, plus a
      latency each; host link: KV bytes / (link BW x e_link).
    - CPU: bandwidth min(DRAM BW, cores x per-core BW) x e_mem; attention: attended KV bytes
      over it; dense stages: max(weight bytes / BW, 2 x params x rows / (cores x per-core
      FLOP/s x e_flops)); Dense Assist: the GPU runs the offloaded stage (its dense roofline)
      behind a fixed call overhead and the activations' trip over the host link both ways;
      Fused-Assist makes N calls, N - 1 post-attention ones and a final one that runs the
      last post-attention stage and the post-layer (Eq. 7-8).
    - The stage-boundary wait (§4.2: a call waits for "the completion of the current stage"
      of a busy GPU-main step): not in ``cpu_step``, whose calls the simulated workers run
      one by one against the GPU step actually in flight (``boundary_waits``); for
      Algorithm 1's scores, ``stage_wait``.
    """

    boundary_waits = True

    def __init__(self, hw: Hardware, shape: ModelShape):
        self.hw, self.m = hw, shape

    # GPU side
    def gpu_dense(self, params: int, tokens: int) -> float:
        g = self.hw.gpu
        if tokens <= 0:
            return 0.0
        mem = params * self.m.dtype_bytes / (g.count * g.hbm_gbps * 1e9 * g.eff_mem)
        flops = 2 * params * tokens / (g.count * g.bf16_tflops * 1e12 * g.eff_flops)
        return max(mem, flops)

    def gpu_allreduce(self, tokens: int, calls: int) -> float:
        g = self.hw.gpu
        if g.count == 1 or tokens <= 0:
            return 0.0
        size = tokens * self.m.hidden * self.m.dtype_bytes * 2 * (g.count - 1) / g.count
        return calls * (size / (g.interconnect_gbps * 1e9) + g.allreduce_latency_s)

    def link(self, tokens: int) -> float:
        g = self.hw.gpu
        return tokens * self.m.kv_bytes_per_token / (g.link_gbps * 1e9 * g.eff_link)

    def gpu_step(self, w: GpuStepWork, beside: bool = False) -> float:
        g, m = self.hw.gpu, self.m  # (separate boxes: the CPU tier takes no GPU time)
        hbm = g.count * g.hbm_gbps * 1e9 * g.eff_mem
        flops = g.count * g.bf16_tflops * 1e12 * g.eff_flops
        dense = self.gpu_dense(m.dense_params, w.tokens)
        decode_ctx = w.context - w.prefill_tokens  # prefill rows' context is in FLOPs below
        attn = max(decode_ctx, 0) * m.kv_bytes_per_token / hbm
        attn += 4 * m.num_layers * m.q_size * w.prefill_context / flops
        # gated: the CPU rows' q/k/v go down and their attention output comes back per layer
        carried = (w.carried_rows * m.num_layers * (2 * m.q_size + 2 * m.kv_size)
                   * m.dtype_bytes / (g.link_gbps * 1e9 * g.eff_link))
        return (g.step_overhead_s + dense + attn + carried + self.link(w.link_tokens)
                + self.gpu_allreduce(w.tokens, 2 * m.num_layers))

    # CPU side
    def slowdown(self, kind: str, route: str = "") -> float:
        return 1.0  # the hardware descriptions' tiers are separate chips

    def cpu_bandwidth(self) -> float:
        c = self.hw.cpu
        return min(c.dram_gbps, c.cores * c.per_core_gbps) * 1e9 * c.eff_mem

    def cpu_dense(self, params: int, rows: int) -> float:
        c = self.hw.cpu
        mem = params * self.m.dtype_bytes / self.cpu_bandwidth()
        peak = c.amx_tflops_per_core if c.amx else c.avx512_tflops_per_core
        flops = 2 * params * rows / (c.cores * peak * 1e12 * c.eff_flops)
        return max(mem, flops)

    def cpu_attention(self, context: int) -> float:
        return context * self.m.kv_bytes_per_token / self.cpu_bandwidth()

    def assist_call(self, params: int, rows: int, floats_each_way: int) -> tuple[float, float]:
        """(CPU-visible wait, GPU-main time) of one Dense Assist call over ``rows`` rows, once
        GPU-main takes it (the stage-boundary wait is not in it)."""
        g = self.hw.gpu
        gpu = self.gpu_dense(params, rows) + g.assist_overhead_s
        move = 2 * rows * floats_each_way * 4 / (g.link_gbps * 1e9 * g.eff_link)
        return gpu + move, gpu

    def stage_wait(self, step: GpuStepWork) -> float:
        """The mean stage-boundary wait of a call that lands at a uniformly random moment of
        a GPU-main ``step``: half a stage, a stage being 1/N of the step (N layers; the
        pre-layer and post-layer are folded into them). Appendix B's q_x, as the roofline
        sees it."""
        return self.gpu_step(step) / self.m.num_layers / 2

    def cpu_step(self, w: CpuStepWork) -> CpuStepCost:
        m, b = self.m, w.batch
        att = self.cpu_attention(w.context)
        over = self.hw.cpu.step_overhead_s
        if w.route == NEO_PIPELINE:  # attention alone; the dense stages ride the GPU step
            return CpuStepCost(over + att, att, 0.0)
        qkv = m.num_layers * self.cpu_dense(m.qkv_params, b)
        post = m.num_layers * self.cpu_dense(m.post_attn_params, b)
        head = self.cpu_dense(m.head_params, b)
        if w.route == FULL_CPU:
            return CpuStepCost(over + att + qkv + post + head, att, 0.0)
        if w.route == SPLIT_FINAL:  # one call, after the last layer: the post-layer
            wait, gpu = self.assist_call(m.head_params, b, m.hidden)
            local = over + att + qkv + post
            return CpuStepCost(local + wait, att, gpu, (AssistCall(local, wait, gpu),))
        if w.route == FUSED_ASSIST:  # a call per layer after its attention; the last one
            n = m.num_layers  # also runs the post-layer
            wait, gpu = self.assist_call(m.post_attn_params, b, m.hidden + m.q_size)
            last_wait, last_gpu = self.assist_call(m.post_attn_params + m.head_params, b,
                                                   m.hidden + m.q_size)
            local = over + att + qkv
            calls = (*[AssistCall(local / n, wait, gpu)] * (n - 1),
                     AssistCall(local / n, last_wait, last_gpu))
            return CpuStepCost(local + (n - 1) * wait + last_wait, att,
                               (n - 1) * gpu + last_gpu, calls)
        raise ValueError(f"unknown route {w.route!r}")

    def route_scores(self, batch_sizes, context_per_row: int = 0,
                     stage_wait: float = 0.0) -> dict[int, dict[str, float]]:
        """Eq. 6 (λ = 1) on the modeled routes: CPU step time, each assist call's
        ``stage_wait`` (q_x of Eq. 14, CPU-visible only), plus GPU disturbance."""
        out = {}
        for b in batch_sizes:
            out[b] = {}
            for r in (FULL_CPU, SPLIT_FINAL, FUSED_ASSIST):
                c = self.cpu_step(CpuStepWork(b, b * context_per_row, r))
                out[b][r] = c.seconds + len(c.calls) * stage_wait + c.gpu_disturbance
        return out
