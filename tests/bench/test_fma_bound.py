"""bench/cpu_attention.py's compute ceiling: the KV bandwidth of a kernel that did nothing but
its dot products' FMAs, on hand-computed cases."""

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
