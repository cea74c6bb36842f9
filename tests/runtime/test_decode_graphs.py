"""Decode graphs' pure parts (runtime/decode_graphs.py): vLLM's capture sizes, bucket choice,
and the padding scheme: a batch padded to its bucket gives its rows the same logits, and the
padding touches only the scratch block. (The worker's replay path runs in
test_async_copies.py; real CUDA capture in tests/cuda.)"""

from __future__ import annotations

import torch

from dualpace.kv.cache import KVCache
from dualpace.model.batch import SeqChunk, build_forward_batch
from dualpace.model.config import load_model_config
from dualpace.model.stages import StagedModel
from dualpace.model.weights import load_weights
from dualpace.runtime.decode_graphs import PaddedDecodeInputs, bucket_for, capture_sizes


def test_capture_sizes_are_vllms():
    assert capture_sizes(1) == [1]
    assert capture_sizes(4) == [1, 2, 4]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


def test_bucket_is_the_smallest_graph_that_holds_the_batch():
    sizes = capture_sizes(20)
    assert [bucket_for(n, sizes) for n in (1, 3, 4, 5, 9, 17, 20)] == [1, 4, 4, 8, 16, 20, 20]
    assert bucket_for(21, sizes) is None


def test_padding_changes_no_row_and_touches_only_the_scratch_block(llama_checkpoint):
    path, _ = llama_checkpoint
    cfg = load_model_config(str(path))
    model = StagedModel(cfg, load_weights(str(path), cfg, torch.float32), 256)
    kv = KVCache(cfg.num_layers, 13, cfg.num_kv_heads, 16, cfg.head_dim, torch.float32)
    for t in (*kv.k, *kv.v):
        t.normal_()
    chunks = [SeqChunk([5], 20, [3, 7]), SeqChunk([9], 0, [11]), SeqChunk([1], 33, [0, 4, 8])]
    before = [t.clone() for t in kv.k]
    eager = model.forward(build_forward_batch(chunks, 16), kv)
    written = [t.clone() for t in kv.k]
    for t, b in zip(kv.k, before):
        t.copy_(b)
    inputs = PaddedDecodeInputs(8, 4, 12, 16, torch.device("cpu"))
    inputs.fill(build_forward_batch(chunks, 16), 8)  # a larger batch first: stale rows
    padded = inputs.fill(build_forward_batch(chunks[:2], 16), 4)
    assert padded.num_rows == 4 and padded.seq_lens.tolist() == [21, 1, 1, 1]
    logits = model.forward(padded, kv)
    torch.testing.assert_close(logits[:2], eager[:2], atol=1e-5, rtol=0)
    for t, w in zip(kv.k, written):
        assert torch.equal(t[[3, 7, 11]], w[[3, 7, 11]])  # rows 0-1 wrote what eager wrote
    changed = [b for b in range(13) if not all(torch.equal(t[b], x[b]) for t, x in
                                                zip(kv.k, before))]
    # Position 20 in block 7, position 0 in block 11, the padding rows in scratch block 12.
    assert changed == [7, 11, 12]


def test_the_graphs_start_up_check_passes_and_catches_padding_that_reads_real_blocks(
        llama_checkpoint):
    """DecodeGraphs.check on the torch backend (CPU: recorded stages): a correct capture
    passes; a replay whose bucket's rows keep stale block tables (here: every row pointed at
    block 0) is reported."""
    from dualpace.runtime.decode_graphs import DecodeGraphs

    path, _ = llama_checkpoint
    cfg = load_model_config(str(path))
    model = StagedModel(cfg, load_weights(str(path), cfg, torch.float32), 256)
    kv = KVCache(cfg.num_layers, 13, cfg.num_kv_heads, 16, cfg.head_dim, torch.float32)
    inputs = PaddedDecodeInputs(8, 4, 12, 16, torch.device("cpu"))
    graphs = DecodeGraphs(model, kv, inputs, capture_sizes(8), per_stage=True)
    graphs.capture()
    assert graphs.check(1e-4) is None
    real_fill = inputs.fill

    def fill(fb, bucket):
        view = real_fill(fb, bucket)
        inputs.block_tables[:bucket] = 0
        return view

    inputs.fill = fill
    assert graphs.check(1e-4).startswith("a replayed decode batch of 3 rows (bucket 4)")
    tiny = DecodeGraphs(model, KVCache(cfg.num_layers, 3, cfg.num_kv_heads, 16, cfg.head_dim,
                                       torch.float32),
                        PaddedDecodeInputs(8, 4, 2, 16, torch.device("cpu")), [1, 2, 4],
                        per_stage=False)
    tiny.capture()
    assert tiny.check(1e-4) is None  # a pool too small for the check's batch: not checked
