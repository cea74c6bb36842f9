"""The gated baseline's Eq. 1 (paper §3.1): both inequalities, NEO's per-request admission,
the pipelined-beats-GPU-only test, and the online fits behind them; hand-computed cases."""

from __future__ import annotations

import pytest

from dualpace.engine.cost_model import (
    GpuWork,
    NeoCostModel,
    OnlineLinear,
    OnlinePlane,
    eq1_margins,
    neo_select,
    pipeline_beats_gpu_only,
)


class Fixed(NeoCostModel):
    """T_lin(n) = 1 + 0.01·n, T_ga(ctx) = 0.001·ctx, T_ca(ctx) = 0.002·ctx (seconds)."""

    def t_lin(self, tokens):
        return 1.0 + 0.01 * tokens if tokens else 0.0

    def t_ga(self, context):
        return 0.001 * context

    def t_ca(self, context):
        return 0.002 * context


def test_eq1_margins_literally():
    m, gpu = Fixed(), GpuWork(tokens=100, context=1000, rows=10)
    # T0_lin = 1 + 0.01·(100 + 2) = 2.02; T1_ca = 0.002·500 = 1.0
    # T1_lin = 1 + 0.01·3 = 1.03; T0_ga = 1.0; T0_ca = 0.002·800 = 1.6
    first, second = eq1_margins(m, gpu, ctx0=800, n0=2, ctx1=500, n1=3)
    assert first == pytest.approx(2.02 - 1.0)
    assert second == pytest.approx(1.03 + 1.0 - 1.6)


def test_first_inequality_rejects_too_much_cpu_attention_in_sub_batch_1():
    m, gpu = Fixed(), GpuWork(tokens=100, context=1000, rows=10)
    first, _ = eq1_margins(m, gpu, ctx0=0, n0=0, ctx1=1500, n1=1)  # 3.0 s > T0_lin 2.0 s
    assert first < 0


def test_second_inequality_rejects_too_much_cpu_attention_in_sub_batch_0():
    m, gpu = Fixed(), GpuWork(tokens=100, context=0, rows=10)
    _, second = eq1_margins(m, gpu, ctx0=1000, n0=1, ctx1=0, n1=0)  # 2.0 s > 0 + 0
    assert second < 0


def test_pipeline_must_beat_gpu_only():
    m = Fixed()
    # GPU-only: 10 rows in 1 + 0.01·100 + 0 = 2 s -> 5 tok/s. One CPU decode reading 1,500
    # tokens: CPU path 3 s > GPU path 2.01 + 0 -> 11 rows / 3 s = 3.7 tok/s: rejected.
    gpu = GpuWork(tokens=100, context=0, rows=10)
    assert not pipeline_beats_gpu_only(m, gpu, ctx0=0, n0=0, ctx1=1500, n1=1)
    # Reading 500: max(2.01 + 1.01, 1.0) = 3.02 s for 11 rows -> 3.64 < 5: rejected too.
    assert not pipeline_beats_gpu_only(m, gpu, ctx0=0, n0=0, ctx1=500, n1=1)
    # Ten decodes reading 50 each in sub-batch 0: GPU path 1 + 0.01·110 = 2.1 s, CPU 1.0 s:
    # 20 rows / 2.1 s = 9.5 tok/s > 5: adopted.
    assert pipeline_beats_gpu_only(m, gpu, ctx0=500, n0=10, ctx1=0, n1=0)


def test_neo_select_keeps_decodes_while_both_margins_hold_and_balances():
    m, gpu = Fixed(), GpuWork(tokens=100, context=1000, rows=10)
    reqs = list(range(10))  # each reads 300 context tokens: 0.6 s of CPU attention
    sel = neo_select(m, gpu, reqs, context=lambda r: 300, limit=64,
                     fits=lambda r, chosen: True)
    assert sel.adopted
    n0, n1 = len(sel.sb0), len(sel.sb1)
    ctx0, ctx1 = 300 * n0, 300 * n1
    assert min(eq1_margins(m, gpu, ctx0, n0, ctx1, n1)) >= 0
    # One more decode in either sub-batch would break Eq. 1: NEO stopped at the margin.
    assert min(eq1_margins(m, gpu, ctx0 + 300, n0 + 1, ctx1, n1)) < 0
    assert min(eq1_margins(m, gpu, ctx0, n0, ctx1 + 300, n1 + 1)) < 0
    assert sel.sb0 and sel.sb1  # both sub-batches carry CPU decodes
    assert set(sel.cpu) == set(reqs[: n0 + n1])  # FIFO: the oldest requests


def test_neo_select_respects_host_kv_and_the_batch_limit():
    m, gpu = Fixed(), GpuWork(tokens=1000, context=1000, rows=100)
    sel = neo_select(m, gpu, list(range(10)), context=lambda r: 10, limit=3,
                     fits=lambda r, chosen: r != 1)
    assert sorted(sel.cpu) == [0, 2, 3]


def test_neo_select_with_no_gpu_work_runs_the_head_alone():
    sel = neo_select(Fixed(), GpuWork(0, 0, 0), [7, 8], context=lambda r: 100, limit=8,
                     fits=lambda r, chosen: True)
    assert sel.adopted and sel.sb0 == [] and sel.sb1 == [7]


def test_neo_select_rejects_when_the_pipeline_loses_to_gpu_only():
    m, gpu = Fixed(), GpuWork(tokens=100, context=0, rows=10)
    # Sub-batch 0 cannot hide any CPU attention (no GPU attention, no sub-batch 1), so the
    # decode goes to sub-batch 1, where Eq. 1 holds (T0_lin 2.0 >= T1_ca 1.0; 1.01 >= 0).
    # But its own dense pass costs T1_lin = 1.01 s: 11 rows in 3.01 s lose to 10 in 2.0 s.
    sel = neo_select(m, gpu, [1], context=lambda r: 500, limit=8,
                     fits=lambda r, chosen: True)
    assert not sel.adopted and sel.cpu == []


def test_online_plane_recovers_a_plane_and_falls_back_to_a_line():
    p = OnlinePlane(prior=(9.0, 9.0, 9.0))
    assert p.coefficients() == (9.0, 9.0, 9.0)
    for x1, x2 in [(1, 5), (2, 1), (7, 3), (4, 9), (10, 2)]:
        p.observe(x1, x2, 0.5 + 0.25 * x1 + 0.125 * x2)
    assert p.coefficients() == pytest.approx((0.5, 0.25, 0.125))
    collinear = OnlinePlane(prior=(9.0, 9.0, 0.0))
    for x in range(1, 6):
        collinear.observe(x, 2 * x, 1.0 + 0.5 * x)  # x2 = 2·x1: the plane is undetermined
    a, b, c = collinear.coefficients()
    assert (a, b, c) == pytest.approx((1.0, 0.5, 0.0))


def test_online_linear_fits_a_line():
    f = OnlineLinear(intercept=5.0, slope=5.0)
    for x in (1, 2, 3, 4):
        f.observe(x, 2.0 + 3.0 * x)
    assert f.coefficients() == pytest.approx((2.0, 3.0))
