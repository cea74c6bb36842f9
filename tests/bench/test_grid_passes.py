"""bench/cpu_attention.py's grid: each row is the pass with the median fraction of DRAM
bandwidth, the passes' fractions kept beside it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def test_a_row_is_its_median_pass_not_its_first_or_worst():
    from cpu_attention import median_pass

    passes = [{"fraction_of_dram_bw": 0.25, "kernel_ms": 4.0},  # a slow spell
              {"fraction_of_dram_bw": 0.91, "kernel_ms": 1.2},
              {"fraction_of_dram_bw": 0.83, "kernel_ms": 1.3}]
    row = median_pass(passes)
    assert row["fraction_of_dram_bw"] == 0.83 and row["kernel_ms"] == 1.3  # one measured pass
    assert row["fraction_samples"] == [0.25, 0.91, 0.83]  # in pass order
    assert row["kernel_ms_samples"] == [4.0, 1.2, 1.3]
    # an even count takes the upper median, still a measured pass
    assert median_pass(passes[:2])["fraction_of_dram_bw"] == 0.91
    assert median_pass(passes[:1])["fraction_of_dram_bw"] == 0.25
    with pytest.raises(ValueError):
        median_pass([])


def test_grid_groups_are_checked_positive_integers():
    from cpu_attention import parse_groups

    assert parse_groups("1,4,8") == (1, 4, 8)
    assert parse_groups("5") == (5,)
    for bad in ("", "1,,8", "x", "4,0", "-1"):
        with pytest.raises(ValueError, match="--grid-groups"):
            parse_groups(bad)


def test_cache_sizes_read_as_sysfs_writes_them(tmp_path):
    from common import llc_bytes, parse_cache_size

    assert parse_cache_size("48K\n") == 48 << 10
    assert parse_cache_size("2M") == 2 << 20
    assert parse_cache_size("4096") == 4096
    for i, size in enumerate(["48K", "32K", "2048K", "307200K"]):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    (tmp_path / "index4").mkdir()  # an entry without a size is passed over
    assert llc_bytes(tmp_path) == 307200 << 10
    assert llc_bytes(tmp_path / "absent") is None


def test_grid_rows_reach_the_asked_kv_bytes_in_whole_blocks():
    from cpu_attention import grid_context

    # 32 sequences x 8 KV heads x head dim 128 x K and V x bf16: 128 KiB a token
    assert grid_context(0, 32, 8, 128, 2, 16) == 1024  # never under the 32k tokens
    assert grid_context(600 << 20, 32, 8, 128, 2, 16) == 4800
    ctx = grid_context(600 << 20, 32, 8, 80, 2, 64)  # 80 KiB a token: 7680, in blocks of 64
    assert ctx == 7680 and ctx % 64 == 0
    ctx = grid_context((600 << 20) + 1, 32, 8, 80, 2, 64)
    assert ctx == 7744 and 32 * 8 * 80 * 2 * 2 * ctx >= (600 << 20) + 1


def test_the_past_llc_model_streams_at_least_the_asked_bytes():
    from common import PAST_LLC_FIXED_PARAMS, PAST_LLC_LAYER_PARAMS, past_llc_layers

    # 4 bytes x (32.77M of LM head + 11.60M a layer): 10 layers 567.6 MiB, 11 611.8
    assert past_llc_layers(600 << 20) == 11
    assert past_llc_layers(567 << 20) == 10
    for mib in (1, 200, 600, 1000, 4096):
        n = past_llc_layers(mib << 20)
        assert 4 * (PAST_LLC_FIXED_PARAMS + n * PAST_LLC_LAYER_PARAMS) >= mib << 20
        if n > 1:
            assert 4 * (PAST_LLC_FIXED_PARAMS + (n - 1) * PAST_LLC_LAYER_PARAMS) < mib << 20


def test_the_l2_is_the_level_2_data_or_unified_cache(tmp_path):
    from common import l2_bytes

    # sysfs on a Zen 3: L1d, L1i, L2 unified, L3 unified
    for i, (level, kind, size) in enumerate([(1, "Data", "32K"), (1, "Instruction", "32K"),
                                             (2, "Unified", "512K"), (3, "Unified", "32768K")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(kind + "\n")
        (d / "size").write_text(size + "\n")
    assert l2_bytes(tmp_path) == 512 << 10
    (tmp_path / "index2" / "type").write_text("Instruction\n")  # an L2 for code only
    assert l2_bytes(tmp_path) is None
    assert l2_bytes(tmp_path / "absent") is None


def test_the_in_cache_twin_folds_every_table_onto_the_first_blocks():
    import torch
    from cpu_attention import hot_pool

    tables = torch.tensor([[7, 2, 9], [0, 5, 12]], dtype=torch.int32)
    # 256 KiB of cache, 64 KiB blocks (K and V): 4 blocks, b -> b mod 4
    n, hot = hot_pool(tables, 256 << 10, 64 << 10)
    assert n == 4
    assert hot.tolist() == [[3, 2, 1], [0, 1, 0]]
    assert hot.dtype == torch.int32
    # a block larger than the cache still leaves one block to read
    n, hot = hot_pool(tables, 16 << 10, 64 << 10)
    assert n == 1 and hot.tolist() == [[0, 0, 0], [0, 0, 0]]


def test_the_in_cache_twin_is_the_attention_of_its_folded_tables():
    """The twin's call reads the folded blocks: the same as the reference over a cache that
    holds, at each table position, the block it folds to."""
    import torch
    from cpu_attention import case, hot_pool

    from dualpace.kernels import cpu
    from dualpace.model.attention_ref import paged_decode_attention_ref

    if not cpu.available():
        pytest.skip("cext not built")
    q, k, v, t, sl = case(2, 64, 8, 2, 64, 16, torch.float32)
    n, hot = hot_pool(t, 3 * 2 * k[0].numel() * 4, 2 * k[0].numel() * 4)
    assert n == 3
    got = cpu.paged_decode_attention(q, k[:n], v[:n], hot, sl, 0.125)
    want = paged_decode_attention_ref(q, k, v, hot.long(), sl, 0.125)
    assert torch.allclose(got, want, atol=2e-5)
