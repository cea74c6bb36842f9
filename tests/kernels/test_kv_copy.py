"""KV append at slots and block copies between pools (cext) against torch indexing."""

from __future__ import annotations

import pytest
import torch

from dualpace.kernels import cpu
from dualpace.kv.cache import write_kv


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_append_matches_torch_write(dtype):
    g = torch.Generator().manual_seed(0)
    shape = (12, 2, 16, 64)
    kc, vc = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    kr, vr = kc.clone(), vc.clone()
    k = torch.randn(20, 2, 64, generator=g).to(dtype)
    v = torch.randn(20, 2, 64, generator=g).to(dtype)
    slots = torch.randperm(12 * 16, generator=g)[:20]
    cpu.kv_append(kc, vc, k, v, slots)
    write_kv(kr, vr, k, v, slots)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    # An oracle independent of the package: token t lands in block slot // 16, row slot % 16.
    ko, vo = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    for t, slot in enumerate(slots.tolist()):
        ko[slot // 16, :, slot % 16, :] = k[t]
        vo[slot // 16, :, slot % 16, :] = v[t]
    assert torch.equal(kc, ko) and torch.equal(vc, vo)


def test_kv_append_rejects_bad_slots_and_shapes():
    kc = torch.zeros(4, 2, 8, 16)
    vc = torch.zeros(4, 2, 8, 16)
    k = torch.zeros(3, 2, 16)
    with pytest.raises(ValueError, match="slots"):
        cpu.kv_append(kc, vc, k, k, torch.tensor([0, 1, 32]))
    with pytest.raises(ValueError, match="slots"):
        cpu.kv_append(kc, vc, k, k, torch.tensor([0, -1, 2]))
    with pytest.raises(ValueError, match="slots"):
        cpu.kv_append(kc, vc, k, k, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="k"):
        cpu.kv_append(kc, vc, torch.zeros(3, 1, 16), k, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="k"):
        cpu.kv_append(kc, vc, k.bfloat16(), k, torch.tensor([0, 1, 2]))
    assert kc.abs().sum() == 0  # nothing was written by a rejected call


def test_copy_blocks_between_pools():
    src = torch.randn(10, 2, 16, 32)
    dst = torch.zeros(6, 2, 16, 32)
    cpu.copy_blocks(src, dst, torch.tensor([7, 1, 4]), torch.tensor([0, 5, 2]))
    assert torch.equal(dst[0], src[7]) and torch.equal(dst[5], src[1])
    assert torch.equal(dst[2], src[4]) and dst[[1, 3, 4]].abs().sum() == 0
    with pytest.raises(ValueError, match="block id"):
        cpu.copy_blocks(src, dst, torch.tensor([10]), torch.tensor([0]))
    with pytest.raises(ValueError, match="block id"):
        cpu.copy_blocks(src, dst, torch.tensor([0]), torch.tensor([6]))
    with pytest.raises(ValueError, match="dst"):
        cpu.copy_blocks(src, torch.zeros(6, 2, 8, 32), torch.tensor([0]), torch.tensor([0]))
    with pytest.raises(ValueError, match="dst_ids"):
        cpu.copy_blocks(src, dst, torch.tensor([0, 1]), torch.tensor([0]))
