"""The vector-FMA throughput probe (cext dp_fma_probe, cpu.fma_rate) that benches put beside
the DRAM bandwidth as the compute ceiling of the attention kernels."""

from __future__ import annotations

import pytest

from dualpace.kernels import cpu
from dualpace.kernels._lib import require

from .test_paged_attention import isa_param

LANES = {"avx2": 8, "avx512": 16, "avx512_bf16": 16, "amx": 16}


@pytest.mark.parametrize("isa", [isa_param(n) for n in LANES])
def test_the_probe_runs_the_fmas_it_reports(isa):
    ffi, lib = require()
    lanes, sink = ffi.new("int *"), ffi.new("double *")
    n1 = lib.dp_fma_probe(cpu.ISAS[isa], 1000, lanes, sink)
    n2 = lib.dp_fma_probe(cpu.ISAS[isa], 3000, lanes, sink)
    assert n1 > 0 and n2 == 3 * n1  # a fixed number of chains per iteration
    assert lanes[0] == LANES[isa]
    # chain j (a = a * 0.9999 + 1e-4 from 0.001 j) after n FMAs: 1 - (1 - 0.001 j) 0.9999^n,
    # in every lane: the sum says each chain ran all of its FMAs
    chains = n2 // 3000
    expect = sum(LANES[isa] * (1 - (1 - 0.001 * j) * 0.9999 ** 3000) for j in range(chains))
    assert sink[0] == pytest.approx(expect, rel=1e-3)
    rate, width = cpu.fma_rate(isa, seconds=0.01, repeats=2)
    assert width == LANES[isa]
    # a core of 2013 or later: 0.5-8 G vector FMAs a second (here ~2.2 G on a Zen 1)
    assert 3e8 < rate < 2e10


def test_scalar_and_bad_arguments_are_refused():
    ffi, lib = require()
    lanes, sink = ffi.new("int *"), ffi.new("double *")
    assert lib.dp_fma_probe(cpu.ISAS["scalar"], 10, lanes, sink) == -1
    assert lib.dp_fma_probe(cpu.ISAS[cpu.supported_isas()[-1]], 0, lanes, sink) == -2
    assert lib.dp_fma_probe(cpu.ISAS["avx2"], 10, ffi.NULL, sink) == -2
    with pytest.raises(ValueError, match="no vector FMAs"):
        cpu.fma_rate("scalar")
