"""The cost model the gated (NEO-style) baseline uses to predict Eq. 1's overlap: GPU step
time as a linear function of its rows, CPU attention time as a linear function of the
context tokens it scans, both fitted online from measured steps (exponentially weighted
least squares, so the model follows load and context growth)."""

from __future__ import annotations


class OnlineLinear:
    def __init__(self, intercept: float, slope: float, decay: float = 0.98):
        self.decay = decay
        # Prior: one pseudo-observation pair on the initial line.
        self._n = self._sx = self._sy = self._sxx = self._sxy = 0.0
        self._prior = (intercept, slope)

    def observe(self, x: float, y: float) -> None:
        d = self.decay
        self._n = self._n * d + 1
        self._sx = self._sx * d + x
        self._sy = self._sy * d + y
        self._sxx = self._sxx * d + x * x
        self._sxy = self._sxy * d + x * y

    def predict(self, x: float) -> float:
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
        return a + b * x


class OverlapModel:
    def __init__(self):
        self.gpu = OnlineLinear(intercept=2e-3, slope=2e-4)
        self.cpu = OnlineLinear(intercept=1e-3, slope=2e-6)

    def observe_gpu(self, rows: int, seconds: float) -> None:
        if rows:
            self.gpu.observe(rows, seconds)

    def observe_cpu(self, context_tokens: int, seconds: float) -> None:
        self.cpu.observe(context_tokens, seconds)

    def gpu_time(self, rows: int) -> float:
        return self.gpu.predict(rows) if rows else 0.0

    def cpu_time(self, context_tokens: int) -> float:
        return self.cpu.predict(context_tokens)
