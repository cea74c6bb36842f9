"""The benches' compute ceilings on hand-computed cases: bench/cpu_attention.py's KV
bandwidth of a kernel that did nothing but its dot products' FMAs, and
bench/decode_throughput.py's step floors (weight reads, projection FMAs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_fma_bound_on_hand_computed_shapes():
    from cpu_attention import fma_bound_gb_per_s

    # GQA 4, D 128, bf16, AVX2 (8 lanes): QK 4*128/8 = 64 FMAs and PV 64 per token and KV
    # head, 512 bytes of K and V; 2e9 FMAs/s on 2 cores: 512 B / 64 ns * 2 = 16 GB/s
    assert fma_bound_gb_per_s(4, 128, 2, 8, 2e9, 2, False) == pytest.approx(16.0)
    # GQA 8 halves it; fp32 KV doubles the bytes
    assert fma_bound_gb_per_s(8, 128, 2, 8, 2e9, 2, False) == pytest.approx(8.0)
    assert fma_bound_gb_per_s(8, 128, 4, 8, 2e9, 2, False) == pytest.approx(16.0)
    # 16 lanes, one core: 2 * 8 * 64 / 16 = 64 FMAs for 256 bytes at 1e9/s: 4 GB/s; bf16
    # dot products (two products a lane) take half the instructions: 8 GB/s
    assert fma_bound_gb_per_s(8, 64, 2, 16, 1e9, 1, False) == pytest.approx(4.0)
    assert fma_bound_gb_per_s(8, 64, 2, 16, 1e9, 1, True) == pytest.approx(8.0)
    # the head dim cancels: bytes and FMAs both scale with it
    assert fma_bound_gb_per_s(1, 80, 2, 8, 2e9, 1, False) == pytest.approx(
        fma_bound_gb_per_s(1, 96, 2, 8, 2e9, 1, False))


def test_decode_step_floors_on_hand_computed_cases():
    from decode_throughput import step_floors

    # 100 MB of weights at 20 GB/s: 5 ms; 25M projection weights at batch 1 as 16-lane FMAs
    # at 1e9/s on 2 cores: 25e6 / 16 / 2e9 = 0.78 ms, so the reads bound the step
    f = step_floors(100_000_000, 25_000_000, 1, 20e9, 1e9, 16, 2)
    assert f["memory"] == pytest.approx(5e-3)
    assert f["fma"] == pytest.approx(25e6 / 16 / 2e9)
    assert (f["roofline"], f["bound"]) == (pytest.approx(5e-3), "memory")
    # batch 32: 32x the FMAs, 25 ms, now the bound; the reads stay 5 ms
    f = step_floors(100_000_000, 25_000_000, 32, 20e9, 1e9, 16, 2)
    assert (f["roofline"], f["bound"]) == (pytest.approx(25e-3), "fma")
    assert f["memory"] == pytest.approx(5e-3)
    # 8 lanes (AVX2) double the FMA time; one core doubles it again
    assert step_floors(100_000_000, 25_000_000, 32, 20e9, 1e9, 8, 1)["fma"] == pytest.approx(
        0.1)
    # no FMA rate (tile products, or the scalar path): the reads alone
    f = step_floors(100_000_000, 25_000_000, 32, 20e9, None, None, 2)
    assert (f["fma"], f["roofline"], f["bound"]) == (None, pytest.approx(5e-3), "memory")
