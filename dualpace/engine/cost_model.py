"""The gated (NEO-style) baseline's iteration model and Eq. 1 admission (paper §3.1, Fig. 4).

NEO's GPU iteration has two sub-batches. Sub-batch 0 holds the GPU work (prefills, GPU
decodes) and some CPU-resident decodes, sub-batch 1 the other CPU-resident decodes; the GPU
runs every dense stage of both, the CPU only the attention over host KV, and one sub-batch's
CPU attention overlaps the other's GPU work. With T_j^lin the GPU's pre+post-attention time
of sub-batch j, T_0^ga the GPU attention of sub-batch 0 and T_j^ca the CPU attention:

    (1)  T_0^lin ≥ T_1^ca,    T_1^lin + T_0^ga ≥ T_0^ca

NEO tentatively adds each CPU decode and removes it when either margin goes negative, and
adopts the pipeline only if its predicted token rate beats GPU-only execution.

The times come from online fits of what the workers report: the GPU step as
a + b·(dense tokens) + c·(GPU attention context) (so T_lin is predicted from *tokens*, not
rows, and T_ga from the context it reads), CPU attention as a' + b'·(context tokens). Both
use exponentially weighted least squares, so they follow load and context growth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


class OnlineLinear:
    """y ≈ a + b·x, fitted online (exponentially weighted least squares, non-negative)."""

    def __init__(self, intercept: float, slope: float, decay: float = 0.98):
        self.decay = decay
        self._n = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self._prior = (intercept, slope)

    def observe(self, x: float, y: float) -> None:
        d = self.decay
        self._n = self._n * d + 1
        self._sx = self._sx * d + x
        self._sy = self._sy * d + y
        self._sxx = self._sxx * d + x * x
        self._sxy = self._sxy * d + x * y

    def coefficients(self) -> tuple[float, float]:
        a, b = self._prior
        if self._n >= 2:
            var = self._sxx - self._sx * self._sx / self._n
            if var > 1e-12:
                b = max((self._sxy - self._sx * self._sy / self._n) / var, 0.0)
                a = max((self._sy - b * self._sx) / self._n, 0.0)
            else:
                a, b = self._sy / self._n, 0.0
        elif self._n >= 1:
            a = max(self._sy / self._n - b * self._sx / self._n, 0.0)
        return a, b

    def predict(self, x: float) -> float:
        a, b = self.coefficients()
        return a + b * x


class OnlinePlane:
    """y ≈ a + b·x1 + c·x2, fitted online (weighted normal equations, 3x3 solve). While the
    data do not determine the plane (too few points, or x2 moving with x1), a line in x1
    with the prior's c; before any data, the prior."""

    def __init__(self, prior: tuple[float, float, float], decay: float = 0.98):
        self.decay = decay
        self.prior = prior
        self._m = [[0.0] * 3 for _ in range(3)]  # Σ w·f·fᵀ with f = (1, x1, x2)
        self._v = [0.0] * 3  # Σ w·f·y
        self._line = OnlineLinear(prior[0], prior[1], decay)  # y - c·x2 against x1

    def observe(self, x1: float, x2: float, y: float) -> None:
        f = (1.0, x1, x2)
        for i in range(3):
            self._v[i] = self._v[i] * self.decay + f[i] * y
            for j in range(3):
                self._m[i][j] = self._m[i][j] * self.decay + f[i] * f[j]
        self._line.observe(x1, y - self.prior[2] * x2)

    def coefficients(self) -> tuple[float, float, float]:
        sol = _solve3(self._m, self._v) if self._m[0][0] >= 3 else None
        if sol is None or min(sol) < 0:
            a, b = self._line.coefficients()
            return a, b, self.prior[2]
        return sol

    def predict(self, x1: float, x2: float) -> float:
        a, b, c = self.coefficients()
        return a + b * x1 + c * x2


def _solve3(m: list[list[float]], v: list[float]) -> tuple[float, float, float] | None:
    """Gaussian elimination with partial pivoting; None when (near) singular."""
    a = [[*row, v[i]] for i, row in enumerate(m)]
    scale = max(abs(x) for row in m for x in row) or 1.0
    for col in range(3):
        piv = max(range(col, 3), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) <= 1e-9 * scale:
            return None
        a[col], a[piv] = a[piv], a[col]
        for r in range(3):
            if r != col:
                k = a[r][col] / a[col][col]
                for c in range(col, 4):
                    a[r][c] -= k * a[col][c]
    return tuple(a[i][3] / a[i][i] for i in range(3))


class NeoCostModel:
    """Predicted T_lin(tokens), T_ga(context) and T_ca(context) in seconds."""

    def __init__(self):
        self.gpu = OnlinePlane(prior=(2e-3, 2e-5, 1e-7))
        self.cpu = OnlineLinear(intercept=1e-3, slope=2e-6)

    def observe_gpu(self, dense_tokens: int, attn_context: int, seconds: float) -> None:
        if dense_tokens:
            self.gpu.observe(dense_tokens, attn_context, seconds)

    def observe_cpu(self, context_tokens: int, seconds: float) -> None:
        self.cpu.observe(context_tokens, seconds)

    def t_lin(self, tokens: int) -> float:
        a, b, _ = self.gpu.coefficients()
        return a + b * tokens if tokens else 0.0

    def t_ga(self, context: int) -> float:
        return self.gpu.coefficients()[2] * context

    def t_ca(self, context: int) -> float:
        return self.cpu.predict(context) if context else 0.0


@dataclass
class GpuWork:
    """Sub-batch 0's GPU part: batched tokens, attention context, rows that sample."""

    tokens: int
    context: int
    rows: int


@dataclass
class NeoSelection:
    sb0: list = field(default_factory=list)  # CPU decodes in sub-batch 0
    sb1: list = field(default_factory=list)  # sub-batch 1
    adopted: bool = False  # the pipeline beat GPU-only (or liveness ran the head)

    @property
    def cpu(self) -> list:
        return self.sb0 + self.sb1


def eq1_margins(m: NeoCostModel, gpu: GpuWork, ctx0: int, n0: int, ctx1: int,
                n1: int) -> tuple[float, float]:
    """Eq. 1's two margins: (T_0^lin − T_1^ca, T_1^lin + T_0^ga − T_0^ca); sub-batch j has
    n_j CPU decodes reading ctx_j context tokens (one dense token each)."""
    t0_lin = m.t_lin(gpu.tokens + n0)
    t1_lin = m.t_lin(n1)
    return (t0_lin - m.t_ca(ctx1),
            t1_lin + m.t_ga(gpu.context) - m.t_ca(ctx0))


def pipeline_beats_gpu_only(m: NeoCostModel, gpu: GpuWork, ctx0: int, n0: int, ctx1: int,
                            n1: int) -> bool:
    """NEO's last test: the pipelined iteration's predicted token rate against GPU-only.
    The pipelined iteration takes the longer of the GPU path (both sub-batches' dense work
    and sub-batch 0's GPU attention) and the CPU path (both CPU attentions)."""
    gpu_path = m.t_lin(gpu.tokens + n0) + m.t_lin(n1) + m.t_ga(gpu.context)
    cpu_path = m.t_ca(ctx0) + m.t_ca(ctx1)
    t_pipe = max(gpu_path, cpu_path)
    if t_pipe <= 0:
        return False
    rate_pipe = (gpu.rows + n0 + n1) / t_pipe
    t_gpu = m.t_lin(gpu.tokens) + m.t_ga(gpu.context)
    rate_gpu = gpu.rows / t_gpu if t_gpu > 0 else 0.0
    return rate_pipe > rate_gpu


def neo_select(m: NeoCostModel, gpu: GpuWork, candidates: list,
               context: Callable[[object], int], limit: int,
               fits: Callable[[object, list], bool]) -> NeoSelection:
    """NEO's admission over the ready CPU-resident decodes, in FIFO order: each is tried in
    sub-batch 0 (no dense pass of its own), then in sub-batch 1, and kept where both
    margins of Eq. 1 stay non-negative; ``fits(r, chosen)`` is the host KV check (Eq. 2)
    with the decodes chosen so far. The result
    is adopted only if the pipeline beats GPU-only.

    Deviation (liveness): with no GPU work at all, GPU-only would produce nothing and
    Eq. 1 can hold for no CPU decode (sub-batch 0 has no GPU time to hide attention), so the
    FIFO head runs alone; NEO would instead swap it in, which the GPU round does when HBM
    allows."""
    sel = NeoSelection()
    ctx = [0, 0]
    for r in candidates:
        if len(sel.sb0) + len(sel.sb1) >= limit:
            break
        if not fits(r, sel.cpu):
            continue
        c = context(r)
        for j in (0, 1):
            trial = ctx[:]
            trial[j] += c
            n = [len(sel.sb0) + (j == 0), len(sel.sb1) + (j == 1)]
            if min(eq1_margins(m, gpu, trial[0], n[0], trial[1], n[1])) >= 0:
                (sel.sb0 if j == 0 else sel.sb1).append(r)
                ctx = trial
                break
    if sel.cpu and pipeline_beats_gpu_only(m, gpu, ctx[0], len(sel.sb0), ctx[1],
                                           len(sel.sb1)):
        sel.adopted = True
        return sel
    sel = NeoSelection()
    if gpu.tokens == 0 and candidates:
        head = next((r for r in candidates if fits(r, [])), None)
        if head is not None:
            sel.sb1, sel.adopted = [head], True
    return sel
