"""The native dense stages (cext/layer.c via model/native_stages.py) against the torch stages
of the same model, on every ISA path this CPU has, for Llama (GQA, llama3 RoPE), Qwen3
(q/k norm, tied head) and Qwen2 (QKV bias) checkpoints, with fp32, bf16 and fp16 KV."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from dualpace.kernels import cpu as cpu_kernels
from dualpace.kv.cache import KVCache
from dualpace.model import native_stages
from dualpace.model.config import load_model_config
from dualpace.model.native_stages import NATIVE_MAX_ROWS, why_not_native
from dualpace.model.stages import StagedModel
from dualpace.model.weights import load_weights

pytestmark = pytest.mark.skipif(not cpu_kernels.available(), reason="cext not built")

ISAS = cpu_kernels.supported_isas() if cpu_kernels.available() else []
KV_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def models(hf_checkpoint, monkeypatch_module):
    """(native model, torch-stages model) over the same weights."""
    _, path, _ = hf_checkpoint
    cfg = load_model_config(path)
    w = load_weights(path, cfg, torch.float32)
    native = StagedModel(cfg, w, 512)
    monkeypatch_module.setenv("DUALPACE_NATIVE_STAGES", "0")
    plain = StagedModel(cfg, w, 512)
    monkeypatch_module.delenv("DUALPACE_NATIVE_STAGES")
    assert native.native is not None and plain.native is None
    return cfg, native, plain


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_default_isa", request.param)
    return request.param


@pytest.fixture(params=[i for i in ISAS if i in cpu_kernels.GEMM_ISAS])
def gemm_path(request, monkeypatch):
    """``isa`` over the paths that have the cext GEMM."""
    monkeypatch.setattr(cpu_kernels, "_default_isa", request.param)
    return request.param


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-5) -> None:
    scale = b.abs().max().item() + 1e-6
    assert (a - b).abs().max().item() <= rtol * scale * 10, (a - b).abs().max()


def _kv(cfg, dtype, blocks=8, bs=16):
    return KVCache(cfg.num_layers, blocks, cfg.num_kv_heads, bs, cfg.head_dim, dtype)


@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=str)
def test_pre_attention_matches_torch_stages(models, isa, rows, kv_dtype):
    cfg, native, plain = models
    g = torch.Generator().manual_seed(rows)
    hidden = torch.randn(rows, cfg.hidden_size, generator=g)
    positions = torch.randint(0, 500, (rows,), generator=g)
    slots = torch.randperm(8 * 16, generator=g)[:rows]
    kv_n, kv_t = _kv(cfg, kv_dtype), _kv(cfg, kv_dtype)
    for layer in range(cfg.num_layers):
        q_n = native.native.pre(layer, hidden, positions, slots, kv_n.k[layer], kv_n.v[layer])
        q, k, v = plain.qkv(layer, hidden, positions)
        plain.append_kv(layer, k, v, type("B", (), {"slot_mapping": slots}), kv_t)
        assert q_n.shape == q.shape
        _close(q_n, q)
        # K/V rounded to a 16-bit cache may land one unit apart when fp32 differs by a hair
        tol = 1e-5 if kv_dtype == torch.float32 else 1e-2
        _close(kv_n.k[layer].float(), kv_t.k[layer].float(), tol)
        _close(kv_n.v[layer].float(), kv_t.v[layer].float(), tol)
        untouched = torch.ones(8 * 16, dtype=torch.bool)
        untouched[slots] = False
        flat = kv_n.k[layer].permute(0, 2, 1, 3).reshape(8 * 16, -1)
        assert not flat[untouched].any(), "a slot not in slot_mapping was written"


@pytest.mark.parametrize("rows", [1, 3, 17])
def test_post_attention_and_final_match_torch_stages(models, isa, rows):
    cfg, native, plain = models
    g = torch.Generator().manual_seed(100 + rows)
    hidden = torch.randn(rows, cfg.hidden_size, generator=g)
    attn = torch.randn(rows, cfg.q_size, generator=g)
    for layer in range(cfg.num_layers):
        out = native.post_attention(layer, hidden, attn)
        _close(out, plain.post_attention(layer, hidden, attn))
    hidden_before = hidden.clone()
    _close(native.post_layer(hidden), plain.post_layer(hidden))
    assert torch.equal(hidden, hidden_before), "the stages must not write their inputs"


def test_silu_over_its_whole_range(models, isa, monkeypatch):
    """Gates driven to +-hundreds (exp's overflow side) agree with torch's SiLU; with 5
    threads the slices of the intermediate width are not multiples of the vector width, so
    the scalar tail runs too."""
    cfg, native, plain = models
    monkeypatch.setattr(cpu_kernels, "_threads_override", 5)
    lw = plain.w.layers[0]
    big = dataclasses.replace(lw, gate_up=lw.gate_up * 300.0)
    weights = dataclasses.replace(plain.w, layers=[big, *plain.w.layers[1:]])
    nat = native_stages.NativeStages(cfg, weights, native.rope.cos, native.rope.sin)
    plain_big = StagedModel.__new__(StagedModel)
    plain_big.__dict__.update(plain.__dict__)
    plain_big.w = weights
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(2, cfg.hidden_size, generator=g)
    attn = torch.randn(2, cfg.q_size, generator=g)
    _close(nat.post(0, hidden, attn), plain_big.post_attention(0, hidden, attn))


CHUNK = NATIVE_MAX_ROWS + 9  # a prefill chunk: GEMMs, the elementwise phases in C


@pytest.mark.parametrize("rows", [2, CHUNK])
@pytest.mark.parametrize("bad", ["position", "slot"])
def test_bad_index_is_an_error_and_writes_nothing(models, bad, rows):
    cfg, native, _ = models
    kv = _kv(cfg, torch.float32, blocks=16)
    hidden = torch.randn(rows, cfg.hidden_size)
    positions = torch.arange(rows)
    slots = torch.arange(rows)
    if bad == "position":
        positions[-1] = native.rope.max_positions
    else:
        slots[-1] = 16 * 16
    stage = native.native.pre if rows <= NATIVE_MAX_ROWS else native.native.pre_chunk
    with pytest.raises(ValueError, match="positions" if bad == "position" else "slot_mapping"):
        stage(0, hidden, positions, slots, kv.k[0], kv.v[0])
    assert not kv.k[0].any() and not kv.v[0].any()


@pytest.mark.parametrize("gemm", ["torch", "cext"])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=str)
def test_prefill_chunks_take_the_gemm_stages_and_match_torch(models, isa, kv_dtype, gemm,
                                                             monkeypatch):
    """Above NATIVE_MAX_ROWS rows the weight-streaming stages are not called (a GEMM wins
    there); the chunk stages (GEMMs around C norm, RoPE + KV append, SiLU * up) give the
    torch stages' q, K/V and hidden, and leave their inputs and other slots alone; with
    either GEMM (``gemm_isa``: cext/gemm.c, or torch's), the torch stages on torch's."""
    cfg, native, plain = models
    if gemm == "cext" and isa not in cpu_kernels.GEMM_ISAS:
        pytest.skip(f"the {isa} path has no cext GEMM")

    def refuse(*a, **k):
        raise AssertionError("a weight-streaming stage was called for a prefill chunk")

    gemm_calls = []

    def counted_gemm(*a, **k):
        gemm_calls.append(k.get("isa"))
        return real_gemm(*a, **k)

    real_gemm = cpu_kernels.gemm
    monkeypatch.setattr(cpu_kernels, "gemm", counted_gemm)
    monkeypatch.setattr(native.native, "pre", refuse)
    monkeypatch.setattr(native.native, "post", refuse)
    monkeypatch.setattr(native.native, "gemm_isa", isa if gemm == "cext" else None)
    monkeypatch.setattr(plain, "linear", torch.nn.functional.linear)
    g = torch.Generator().manual_seed(11)
    hidden = torch.randn(CHUNK, cfg.hidden_size, generator=g)
    hidden_before = hidden.clone()
    batch = type("B", (), {"positions": torch.randint(0, 500, (CHUNK,), generator=g),
                           "slot_mapping": torch.randperm(16 * 16, generator=g)[:CHUNK]})
    kv_n, kv_t = _kv(cfg, kv_dtype, blocks=16), _kv(cfg, kv_dtype, blocks=16)
    tol = 1e-5 if kv_dtype == torch.float32 else 1e-2
    for layer in range(cfg.num_layers):
        q_n = native.pre_attention(layer, hidden, batch, kv_n)
        q, k, v = plain.qkv(layer, hidden, batch.positions)
        plain.append_kv(layer, k, v, batch, kv_t)
        _close(q_n, q)
        _close(kv_n.k[layer].float(), kv_t.k[layer].float(), tol)
        _close(kv_n.v[layer].float(), kv_t.v[layer].float(), tol)
        untouched = torch.ones(16 * 16, dtype=torch.bool)
        untouched[batch.slot_mapping] = False
        flat = kv_n.k[layer].permute(0, 2, 1, 3).reshape(16 * 16, -1)
        assert not flat[untouched].any(), "a slot not in slot_mapping was written"
        attn = torch.randn(CHUNK, cfg.q_size, generator=g)
        _close(native.post_attention(layer, hidden, attn),
               plain.post_attention(layer, hidden, attn))
    assert torch.equal(hidden, hidden_before), "the stages must not write their inputs"
    # QKV, O, gate/up and down per layer, on the path asked
    assert gemm_calls == ([isa] * 4 * cfg.num_layers if gemm == "cext" else [])


def test_why_not_native(models, monkeypatch):
    cfg, _, plain = models
    w = plain.w
    assert why_not_native(cfg, w, False) is None
    assert "tensor parallel" in why_not_native(cfg, w, True)
    # bf16 / fp16 models run the C stages with fp32 activations inside (mixed precision)
    assert why_not_native(cfg, dataclasses.replace(w, embed=w.embed.bfloat16()), False) is None
    assert "dtype" in why_not_native(cfg, dataclasses.replace(w, embed=w.embed.double()), False)
    odd = dataclasses.replace(cfg, intermediate_size=cfg.intermediate_size + 8)
    assert "intermediate size" in why_not_native(odd, w, False)
    monkeypatch.setenv("DUALPACE_NATIVE_STAGES", "maybe")
    with pytest.raises(ValueError, match="DUALPACE_NATIVE_STAGES"):
        native_stages.native_stages_enabled()


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=str)
def test_decode_attention_matches_the_validating_kernel(models, isa, kv_dtype):
    cfg, native, _ = models
    g = torch.Generator().manual_seed(3)
    kv = _kv(cfg, kv_dtype, blocks=12)
    kv.k[0].copy_(torch.randn(kv.k[0].shape, generator=g))
    kv.v[0].copy_(torch.randn(kv.v[0].shape, generator=g))
    q = torch.randn(3, cfg.num_heads, cfg.head_dim, generator=g)
    tables = torch.tensor([[5, 2, 9, 0], [11, 0, 0, 0], [1, 3, 7, 4]], dtype=torch.int32)
    lens = torch.tensor([40, 3, 64], dtype=torch.int32)
    want = cpu_kernels.paged_decode_attention(q, kv.k[0], kv.v[0], tables, lens, 0.3)
    got = native.native.decode_attention(q, kv.k[0], kv.v[0], tables, lens, 0.3)
    assert torch.equal(got, want)
    # anything unusual (a non-contiguous q) takes the validating wrapper and its error
    q_t = q.transpose(0, 1).contiguous().transpose(0, 1)
    with pytest.raises(ValueError, match="q: must be contiguous"):
        native.native.decode_attention(q_t, kv.k[0], kv.v[0], tables, lens, 0.3)
    bad = tables.clone()
    bad[1, 0] = 12
    with pytest.raises(ValueError, match="block_tables"):
        native.native.decode_attention(q, kv.k[0], kv.v[0], bad, lens, 0.3)
    with pytest.raises(ValueError, match="seq_lens"):
        native.native.decode_attention(q, kv.k[0], kv.v[0], tables,
                                       torch.tensor([40, 3, 65], dtype=torch.int32), 0.3)


def _decode_batch(cfg, lens, bs=16, seed=0):
    """A decode step of len(lens) sequences at the given context lengths (this step's token
    included), each over its own shuffled blocks."""
    from dualpace.model.batch import SeqChunk, build_forward_batch

    g = torch.Generator().manual_seed(seed)
    per = [-(-n // bs) for n in lens]
    perm = torch.randperm(sum(per), generator=g).tolist()
    chunks, at = [], 0
    for n, nb in zip(lens, per):
        tok = int(torch.randint(0, cfg.vocab_size, (1,), generator=g))
        chunks.append(SeqChunk([tok], n - 1, perm[at:at + nb]))
        at += nb
    return build_forward_batch(chunks, bs), sum(per)


def _filled_kv(cfg, dtype, blocks, seed=1):
    kv = _kv(cfg, dtype, blocks=blocks)
    g = torch.Generator().manual_seed(seed)
    for t in kv.k + kv.v:
        t.copy_(torch.randn(t.shape, generator=g))
    return kv


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_decode_layers_is_the_layer_loop_in_one_call(models, isa, kv_dtype):
    """StagedModel.decode_layers (every layer in one C call) computes what ``layer`` by layer
    computes, bit for bit (the same C stages in the same order), writes the same KV, counts
    the attention calls, and gives the time it spent in attention."""
    cfg, native, _ = models
    fb, blocks = _decode_batch(cfg, [1, 17, 40, 33])
    kv_a, kv_b = _filled_kv(cfg, kv_dtype, blocks), _filled_kv(cfg, kv_dtype, blocks)
    hidden = native.pre_layer(fb.input_ids)
    want = hidden
    for i in range(cfg.num_layers):
        want = native.layer(i, want, fb, kv_a)
    before = dict(native.attention_calls)
    got, attn_s = native.decode_layers(hidden, fb, kv_b)
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(kv_a.k + kv_a.v, kv_b.k + kv_b.v))
    key = native.decode_attention.__module__
    assert native.attention_calls[key] - before.get(key, 0) == cfg.num_layers
    assert attn_s > 0
    assert native.decode_layers(hidden, fb, kv_b) is not None  # a second call, cached model


def test_decode_layers_pauses_at_layer_boundaries_for_a_raised_word(models, isa):
    """With pause words (the GPU worker's Dense Assist states) the one-call decode step
    returns to Python after each layer, but the last, at which one of them holds the value;
    serve() runs there and the step goes on from the next layer. A word that never holds it
    costs nothing; either way hidden rows and KV are those of the uninterrupted call."""
    from dualpace.kernels.futex import FutexWord

    cfg, native, _ = models
    fb, blocks = _decode_batch(cfg, [3, 21, 9])
    kvs = [_filled_kv(cfg, torch.float32, blocks) for _ in range(3)]
    hidden = native.pre_layer(fb.input_ids)
    want, _ = native.decode_layers(hidden, fb, kvs[0])
    buf = bytearray(8)
    quiet, raised = FutexWord(buf, 0), FutexWord(buf, 4)
    served = []

    def serve():
        served.append(len(served))
        if len(served) == 2:
            raised.store(0)  # served: the word drops, the rest of the step runs in one go

    quiet.store(0)
    raised.store(7)
    got, attn_s = native.decode_layers(hidden, fb, kvs[1], pause=([quiet, raised], 7, serve))
    assert torch.equal(got, want) and attn_s > 0
    assert len(served) == min(2, cfg.num_layers - 1)
    raised.store(7)
    served.clear()
    native.decode_layers(hidden, fb, kvs[2], pause=([raised], 7, lambda: served.append(1)))
    assert len(served) == cfg.num_layers - 1  # never after the last layer
    served.clear()
    got, _ = native.decode_layers(hidden, fb, kvs[2], pause=([quiet], 7, served.append))
    assert served == []
    for kv in kvs[1:2]:
        assert all(torch.equal(a, b) for a, b in zip(kvs[0].k + kvs[0].v, kv.k + kv.v))


@pytest.mark.parametrize("lens", [[1], [1, 17, 40, 33]], ids=["1 row", "4 rows"])
def test_decode_logits_is_decode_layers_then_post_layer_in_one_call(models, isa, lens):
    """StagedModel.decode_logits (the layers and the LM head in one C call) gives the
    logits that decode_layers then post_layer give, bit for bit (the same C stages: the
    head is final's decode-sized dp_norm_linear), writes the same KV and counts the
    attention calls; ``forward`` of a decode batch returns them."""
    cfg, native, _ = models
    fb, blocks = _decode_batch(cfg, lens, seed=3)
    kv_a, kv_b, kv_c, kv_d = (_filled_kv(cfg, torch.float32, blocks) for _ in range(4))
    hidden = native.pre_layer(fb.input_ids)
    want = native.post_layer(native.decode_layers(hidden, fb, kv_a)[0][fb.logits_indices])
    before = dict(native.attention_calls)
    got, greedy, attn_s = native.decode_logits(fb, kv_b)
    assert got.shape == (len(lens), cfg.vocab_size) and torch.equal(got, want)
    assert greedy is None
    assert all(torch.equal(a, b) for a, b in zip(kv_a.k + kv_a.v, kv_b.k + kv_b.v))
    key = native.decode_attention.__module__
    assert native.attention_calls[key] - before.get(key, 0) == cfg.num_layers
    assert attn_s > 0
    assert torch.equal(native.forward(fb, kv_c), want)
    got, greedy, _ = native.decode_logits(fb, kv_d, greedy=True)
    assert torch.equal(got, want) and greedy == want.argmax(dim=-1).tolist()


def test_decode_logits_embeds_as_pre_layer_and_refuses_a_bad_id(models, isa):
    """The call's own embedding rows are pre_layer's (widened to fp32 as decode_layers
    widens them): the same logits whatever the ids; an id outside the vocabulary is an
    error before anything is written."""
    cfg, native, _ = models
    fb, blocks = _decode_batch(cfg, [4, 9], seed=6)
    for ids in ([0, 1], [cfg.vocab_size - 1, 7]):
        fb.input_ids.copy_(torch.tensor(ids))
        kv_a, kv_b = _filled_kv(cfg, torch.float32, blocks), _filled_kv(cfg, torch.float32, blocks)
        want = native.post_layer(native.decode_layers(native.pre_layer(fb.input_ids), fb,
                                                      kv_a)[0])
        assert torch.equal(native.decode_logits(fb, kv_b)[0], want)
    kv = _filled_kv(cfg, torch.float32, blocks)
    before = [t.clone() for t in kv.k]
    for bad in (cfg.vocab_size, -1):
        fb.input_ids.copy_(torch.tensor([3, bad]))
        with pytest.raises(ValueError, match="input_ids: an id is outside the embedding"):
            native.decode_logits(fb, kv)
    assert all(torch.equal(a, b) for a, b in zip(before, kv.k))


def test_decode_layers_declines_what_it_cannot_run(models):
    cfg, native, plain = models
    fb, blocks = _decode_batch(cfg, [5])
    kv = _filled_kv(cfg, torch.float32, blocks)
    hidden = native.pre_layer(fb.input_ids)
    assert plain.decode_layers(hidden, fb, kv) is None  # no native stages
    from dualpace.model.batch import SeqChunk, build_forward_batch

    prefill = build_forward_batch([SeqChunk([1, 2, 3], 0, [0])], 16)
    assert native.decode_layers(native.pre_layer(prefill.input_ids), prefill, kv) is None
    assert plain.decode_logits(fb, kv) is None
    assert native.decode_logits(prefill, kv) is None


def test_decode_layers_picks_threads_per_layer_from_the_other_tier(models, monkeypatch):
    """With the other tier busy the step runs on this worker's own share, else on every core
    (runtime/thread_share.py's rule, read in C each layer). The attention's KV split follows
    the thread count (2 segments a sequence at 1 thread, 4 at 3), so the output tells which
    count ran."""
    cfg, native, _ = models
    fb, blocks = _decode_batch(cfg, [500, 480], seed=4)
    kv = _filled_kv(cfg, torch.float32, blocks)
    hidden = native.pre_layer(fb.input_ids)
    word = bytearray(4)
    from dualpace.kernels.futex import FutexWord

    peer = FutexWord(word)
    runs = {}
    for threads in (1, 3):
        monkeypatch.setattr(cpu_kernels, "_threads_override", threads)
        runs[threads] = native.native.decode_layers(hidden, fb, kv, native.scale)[0]
    assert not torch.equal(runs[1], runs[3])  # the split showed
    monkeypatch.setattr(cpu_kernels, "_threads_override", 2)
    peer.store(1)
    busy = native.native.decode_layers(hidden, fb, kv, native.scale, (peer.address, 1, 3))[0]
    peer.store(0)
    idle = native.native.decode_layers(hidden, fb, kv, native.scale, (peer.address, 1, 3))[0]
    assert torch.equal(busy, runs[1]) and torch.equal(idle, runs[3])
    peer.close()


@pytest.mark.parametrize("rows", [1, 5])
def test_dense_stages_do_not_depend_on_the_thread_count(models, isa, rows, monkeypatch):
    """The projections' rows are claimed by whichever thread runs (cext dp_claim_rows) in
    runs that start at multiples of 16: each output, SiLU tail included, is the same bit for
    bit at any thread count, and so whether the other tier is busy or not."""
    cfg, native, _ = models
    g = torch.Generator().manual_seed(7 + rows)
    hidden = torch.randn(rows, cfg.hidden_size, generator=g)
    attn = torch.randn(rows, cfg.q_size, generator=g)
    positions = torch.randint(0, 500, (rows,), generator=g)
    slots = torch.randperm(8 * 16, generator=g)[:rows]
    runs = []
    for threads in (1, 2, 3, 5):
        monkeypatch.setattr(cpu_kernels, "_threads_override", threads)
        kv = _kv(cfg, torch.float32)
        q = native.native.pre(0, hidden, positions, slots, kv.k[0], kv.v[0])
        runs.append((q, kv.k[0].clone(), native.post_attention(0, hidden, attn),
                     native.post_layer(hidden)))
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other))


@pytest.mark.parametrize("n", [37, 100, 1000])
def test_linear_rows_are_claimed_whole(isa, n, monkeypatch):
    g = torch.Generator().manual_seed(n)
    x, w = torch.randn(3, 64, generator=g), torch.randn(n, 64, generator=g)
    outs = []
    for threads in (1, 2, 3, 8):
        monkeypatch.setattr(cpu_kernels, "_threads_override", threads)
        outs.append(cpu_kernels.linear(x, w))
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    _close(outs[0], x @ w.T)


def test_shares_of_threads_openmp_did_not_start():
    """A region may get fewer threads than it asked for (OMP_THREAD_LIMIT, nested regions):
    the shares of threads that never started are claimed by those that did."""
    code = (
        "import torch\n"
        "from dualpace.kernels import cpu\n"
        "cpu.set_num_threads(6)\n"
        "g = torch.Generator().manual_seed(3)\n"
        "x, w = torch.randn(2, 64, generator=g), torch.randn(300, 64, generator=g)\n"
        "err = (cpu.linear(x, w) - x @ w.T).abs().max().item()\n"
        "print('ERR', err)\n")
    env = {**os.environ, "OMP_THREAD_LIMIT": "2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    err = float(out.split("ERR")[1])
    assert err < 1e-3, err


# --- mixed precision: a bf16 model's stages in C (weights and KV bf16, fp32 inside) ---------


@pytest.fixture(scope="module")
def bf16_models(hf_checkpoint, monkeypatch_module):
    """(cfg, native bf16 model, torch-stages bf16 model, fp32 torch-stages model) over the
    same checkpoint: the CPU worker's default compute dtype where the CPU has AMX."""
    _, path, _ = hf_checkpoint
    cfg = load_model_config(path)
    w16 = load_weights(path, cfg, torch.bfloat16)
    w32 = load_weights(path, cfg, torch.float32)
    native = StagedModel(cfg, w16, 512)
    monkeypatch_module.setenv("DUALPACE_NATIVE_STAGES", "0")
    plain, exact = StagedModel(cfg, w16, 512), StagedModel(cfg, w32, 512)
    monkeypatch_module.delenv("DUALPACE_NATIVE_STAGES")
    assert native.native is not None and native.native.mixed and plain.native is None
    return cfg, native, plain, exact


def _watch_stages(monkeypatch, stages, count, refuse, why: str) -> list[tuple[str, int]]:
    """Patch NativeStages ``stages``: the methods named in ``count`` run as before and log
    (name, rows) to the list returned; those in ``refuse`` fail the test with ``why``."""
    calls: list[tuple[str, int]] = []
    for name in count:
        stage = getattr(stages, name)

        def counted(*a, stage=stage, name=name):
            rows_in = a[0] if name.startswith("final") else a[1]
            calls.append((name, rows_in.shape[0]))
            return stage(*a)

        monkeypatch.setattr(stages, name, counted)

    def refused(*a, **k):
        raise AssertionError(why)

    for name in refuse:
        monkeypatch.setattr(stages, name, refused)
    return calls


def _bf16_rows(cfg, rows: int, seed: int):
    """(hidden, attn) bf16 rows, the KV blocks they need with room to spare, and a batch of
    random positions and distinct slots in those blocks."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, cfg.hidden_size, generator=g).bfloat16()
    attn = torch.randn(rows, cfg.q_size, generator=g).bfloat16()
    blocks = -(-rows // 16) + 2
    batch = type("B", (), {"positions": torch.randint(0, 500, (rows,), generator=g),
                           "slot_mapping": torch.randperm(blocks * 16, generator=g)[:rows]})
    return hidden, attn, blocks, batch


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / (b.float().abs().max() + 1e-6)).item()


def test_mixed_stages_keep_the_model_dtype_at_their_boundaries(bf16_models, isa):
    """pre/post/final take and give what the torch bf16 stages take and give (bf16 q and
    hidden, fp32 logits), agree with them to bf16 rounding, and write bf16 KV."""
    cfg, native, plain, _ = bf16_models
    g = torch.Generator().manual_seed(5)
    rows = 5  # from 4 rows the AMX path's projections take the tiles
    hidden = torch.randn(rows, cfg.hidden_size, generator=g).bfloat16()
    attn = torch.randn(rows, cfg.q_size, generator=g).bfloat16()
    batch = type("B", (), {"positions": torch.randint(0, 500, (rows,), generator=g),
                           "slot_mapping": torch.randperm(8 * 16, generator=g)[:rows]})
    kv_n, kv_t = _kv(cfg, torch.bfloat16), _kv(cfg, torch.bfloat16)
    for layer in range(cfg.num_layers):
        q_n = native.pre_attention(layer, hidden, batch, kv_n)
        q_t = plain.pre_attention(layer, hidden, batch, kv_t)
        assert q_n.dtype == q_t.dtype == torch.bfloat16 and q_n.shape == q_t.shape
        assert _rel(q_n, q_t) < 3e-2
        assert _rel(kv_n.k[layer], kv_t.k[layer]) < 3e-2
        assert _rel(kv_n.v[layer], kv_t.v[layer]) < 3e-2
        h_n = native.post_attention(layer, hidden, attn)
        h_t = plain.post_attention(layer, hidden, attn)
        assert h_n.dtype == torch.bfloat16 and _rel(h_n, h_t) < 3e-2
    logits = native.post_layer(hidden)
    assert logits.dtype == torch.float32 and _rel(logits, plain.post_layer(hidden)) < 3e-2


def _greedy_logits(model, prompt, steps, kv_dtype):
    """Logits of a prefill and ``steps`` greedy decode steps of one sequence."""
    from dualpace.model.batch import SeqChunk, build_forward_batch

    cfg = model.cfg
    kv = _kv(cfg, kv_dtype, blocks=4)
    blocks = [2, 0, 3, 1]
    out = [model.forward(build_forward_batch([SeqChunk(prompt, 0, blocks)], 16), kv)]
    for s in range(steps):
        tok = int(out[-1][0].argmax())
        fb = build_forward_batch([SeqChunk([tok], len(prompt) + s, blocks)], 16)
        out.append(model.forward(fb, kv))
    return torch.cat(out)


def test_mixed_forward_is_no_less_accurate_than_the_torch_bf16_stages(bf16_models, isa):
    """A prefill and decode steps of the bf16 model, natively (C stages, fp32 inside) and
    through torch's bf16 stages, against the fp32 model on the same weights: the native
    logits are within bf16 rounding of fp32, and not further from them than torch's."""
    cfg, native, plain, exact = bf16_models
    prompt = torch.randint(0, cfg.vocab_size, (9,),
                           generator=torch.Generator().manual_seed(2)).tolist()
    want = _greedy_logits(exact, prompt, 6, torch.float32)
    got_native = _greedy_logits(native, prompt, 6, torch.bfloat16)
    got_torch = _greedy_logits(plain, prompt, 6, torch.bfloat16)
    err_native, err_torch = _rel(got_native, want), _rel(got_torch, want)
    assert err_native < 5e-2, err_native
    assert err_native <= 1.5 * err_torch + 1e-3, (err_native, err_torch)


def test_mixed_prefill_chunks_take_the_torch_stages(bf16_models, monkeypatch):
    """Where the CPU has bf16 arithmetic the chunk stages' fp32 GEMMs do not serve a bf16
    model: its prefill chunks run the torch bf16 stages (oneDNN's bf16 GEMMs), never the
    weight-streaming ones, nor does a head over more than NATIVE_MAX_ROWS rows."""
    cfg, native, plain, _ = bf16_models
    # such a CPU: torch's GEMM has the arithmetic, so nothing takes the cext GEMM either
    monkeypatch.setattr(native.native, "slices_rows", False)
    monkeypatch.setattr(native.native, "gemm_isa", None)

    def refuse(*a, **k):
        raise AssertionError("a native stage was called for a mixed model's prefill chunk")

    for name in ("pre", "post", "pre_chunk", "post_chunk", "final"):
        monkeypatch.setattr(native.native, name, refuse)
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(CHUNK, cfg.hidden_size, generator=g).bfloat16()
    batch = type("B", (), {"positions": torch.randint(0, 500, (CHUNK,), generator=g),
                           "slot_mapping": torch.randperm(16 * 16, generator=g)[:CHUNK]})
    kv_n, kv_t = _kv(cfg, torch.bfloat16, blocks=16), _kv(cfg, torch.bfloat16, blocks=16)
    q_n = native.pre_attention(0, hidden, batch, kv_n)
    assert torch.equal(q_n, plain.pre_attention(0, hidden, batch, kv_t))
    attn = torch.randn(CHUNK, cfg.q_size, generator=g).bfloat16()
    assert torch.equal(native.post_attention(0, hidden, attn),
                       plain.post_attention(0, hidden, attn))
    assert torch.equal(native.post_layer(hidden), plain.post_layer(hidden))


@pytest.mark.parametrize("rows", [NATIVE_MAX_ROWS + 1, 2 * NATIVE_MAX_ROWS + 3])
def test_mixed_rows_past_decode_size_take_the_native_stages_a_slice_at_a_time(
        bf16_models, isa, rows, monkeypatch):
    """Where the CPU lacks bf16 arithmetic (torch's bf16 GEMM widens in software: 7x slower
    here) and the cext GEMM is not there for it (``gemm_isa`` None: the scalar path, or
    $DUALPACE_PREFILL_GEMM=torch), a bf16 model's stages over more than NATIVE_MAX_ROWS rows
    run the decode-sized stages NATIVE_MAX_ROWS rows a call: each slice's result is that
    stage's on the slice (the same KV written), within bf16 rounding of torch's bf16
    stages; no chunk stage runs."""
    cfg, native, plain, _ = bf16_models
    assert native.native.slices_rows == native_stages.torch_gemm_lacks_arithmetic(
        torch.bfloat16)  # what this CPU does unpatched
    monkeypatch.setattr(native.native, "slices_rows", True)
    monkeypatch.setattr(native.native, "gemm_isa", None)
    calls = _watch_stages(monkeypatch, native.native, ("pre", "post", "final"),
                          ("pre_chunk", "post_chunk"),
                          "a chunk stage (fp32 GEMMs) was called for a mixed model")
    hidden, attn, blocks, batch = _bf16_rows(cfg, rows, seed=6)
    slices = [min(NATIVE_MAX_ROWS, rows - r) for r in range(0, rows, NATIVE_MAX_ROWS)]
    kv_n, kv_s, kv_t = (_kv(cfg, torch.bfloat16, blocks=blocks) for _ in range(3))
    q_n = native.pre_attention(1, hidden, batch, kv_n)
    assert calls == [("pre", n) for n in slices]
    # the same stage slice by slice, by hand
    q_s = torch.cat([native.native.pre(1, hidden[r:r + n], batch.positions[r:r + n],
                                       batch.slot_mapping[r:r + n], kv_s.k[1], kv_s.v[1])
                     for r, n in zip(range(0, rows, NATIVE_MAX_ROWS), slices)])
    assert q_n.dtype == torch.bfloat16 and torch.equal(q_n, q_s)
    assert torch.equal(kv_n.k[1], kv_s.k[1]) and torch.equal(kv_n.v[1], kv_s.v[1])
    q_t = plain.pre_attention(1, hidden, batch, kv_t)
    assert _rel(q_n, q_t) < 3e-2 and _rel(kv_n.k[1], kv_t.k[1]) < 3e-2
    calls.clear()
    h_n = native.post_attention(1, hidden, attn)
    assert calls == [("post", n) for n in slices]
    assert h_n.dtype == torch.bfloat16 and h_n.shape == hidden.shape
    assert _rel(h_n, plain.post_attention(1, hidden, attn)) < 3e-2
    calls.clear()
    logits = native.post_layer(hidden)
    assert calls == [("final", n) for n in slices]
    assert logits.dtype == torch.float32 and _rel(logits, plain.post_layer(hidden)) < 3e-2


@pytest.mark.parametrize("rows", [NATIVE_MAX_ROWS + 1, 2 * NATIVE_MAX_ROWS + 3])
def test_mixed_rows_past_decode_size_take_the_gemm_stages_where_torch_lacks_the_arithmetic(
        bf16_models, gemm_path, rows, monkeypatch):
    """Where the CPU lacks bf16 arithmetic and the path has the cext GEMM (``gemm_isa``), a
    bf16 model's pre and post stages over more than NATIVE_MAX_ROWS rows are the chunk
    stages, to the bit what the fp32 chunk stages give on the bf16 weights widened, with
    the model's bf16 boundaries (inputs and outputs rounded, KV stored in bf16): the GEMM
    widens W exactly and sums in fp32 as on fp32 W; the head over as many rows too
    (``final_chunk``, fp32 logits). No decode-sized stage runs for them."""
    isa = gemm_path
    cfg, native, _, _ = bf16_models
    monkeypatch.setattr(native.native, "slices_rows", True)
    monkeypatch.setattr(native.native, "gemm_isa", isa)
    w16 = native.w
    wide = dataclasses.replace(w16, embed=w16.embed.float(), final_norm=w16.final_norm.float(),
                               lm_head=w16.lm_head.float(), layers=[
        dataclasses.replace(lw, **{f.name: getattr(lw, f.name).float()
                                   for f in dataclasses.fields(lw)
                                   if getattr(lw, f.name) is not None})
        for lw in w16.layers])
    # the bf16 model's RoPE tables (computed in its dtype), so only the GEMMs' inputs differ
    fp32 = native_stages.NativeStages(cfg, wide, native.rope.cos, native.rope.sin)
    assert not fp32.mixed
    monkeypatch.setattr(fp32, "gemm_isa", isa)
    calls = _watch_stages(monkeypatch, native.native, ("pre_chunk", "post_chunk", "final_chunk"),
                          ("pre", "post", "final", "final_rows"),
                          "a decode-sized stage ran a mixed model's chunk")
    layer = cfg.num_layers - 1
    hidden, attn, blocks, batch = _bf16_rows(cfg, rows, seed=8)
    kv_n, kv_w = _kv(cfg, torch.bfloat16, blocks=blocks), _kv(cfg, torch.float32, blocks=blocks)
    q_n = native.pre_attention(layer, hidden, batch, kv_n)
    q_w = fp32.pre_chunk(layer, hidden.float(), batch.positions, batch.slot_mapping, kv_w.k[layer],
                         kv_w.v[layer])
    assert calls == [("pre_chunk", rows)]
    assert q_n.dtype == torch.bfloat16 and torch.equal(q_n, q_w.bfloat16())
    assert torch.equal(kv_n.k[layer], kv_w.k[layer].bfloat16())
    assert torch.equal(kv_n.v[layer], kv_w.v[layer].bfloat16())
    calls.clear()
    h_n = native.post_attention(layer, hidden, attn)
    assert calls == [("post_chunk", rows)]
    assert h_n.dtype == torch.bfloat16
    assert torch.equal(h_n, fp32.post_chunk(layer, hidden.float(), attn.float()).bfloat16())
    calls.clear()
    logits = native.post_layer(hidden)
    assert calls == [("final_chunk", rows)]
    assert logits.dtype == torch.float32 and torch.equal(logits, fp32.final_chunk(hidden.float()))


def test_a_mixed_model_takes_the_cext_gemm_only_where_torch_lacks_the_arithmetic(
        bf16_models, models):
    """This CPU, unpatched: a bf16 model's chunks get the cext GEMM where torch's bf16 GEMM
    would widen in software and the process's path has the GEMM, and none where torch's has
    the arithmetic (its chunks keep the torch stages); an fp32 model gets the fp32 choice."""
    native = bf16_models[1].native
    path = cpu_kernels.resolve_isa()
    flag = os.environ.get("DUALPACE_PREFILL_GEMM", "auto").strip().lower()
    if native.slices_rows and path in cpu_kernels.GEMM_ISAS and flag != "torch":
        assert native.gemm_isa == path
    else:
        assert native.gemm_isa is None
    assert models[1].native.gemm_isa == cpu_kernels.prefill_gemm_isa()


def test_which_cpus_slice_a_mixed_models_rows(models, monkeypatch):
    """bf16 without AVX512_BF16 and fp16 without AMX (standing for AVX512_FP16) slice; fp32
    never (its chunks take the fp32 GEMM)."""
    assert models[1].native.slices_rows is False
    feats = {"avx2": True, "avx512": True, "avx512_bf16": False, "amx_bf16": False}
    monkeypatch.setattr(cpu_kernels, "cpu_features", lambda: dict(feats))
    lacks = native_stages.torch_gemm_lacks_arithmetic
    assert lacks(torch.bfloat16) and lacks(torch.float16) and not lacks(torch.float32)
    feats["avx512_bf16"] = True
    assert not lacks(torch.bfloat16) and lacks(torch.float16)
    feats["amx_bf16"] = True
    assert not lacks(torch.bfloat16) and not lacks(torch.float16)


def test_mixed_decode_layers_matches_the_layer_loop(bf16_models, isa):
    """decode_layers keeps the residual in fp32 across layers where the layer loop rounds it
    to bf16 at every stage boundary: the two agree to bf16 rounding, write the same KV to
    within it, and hand back bf16."""
    cfg, native, _, _ = bf16_models
    fb, blocks = _decode_batch(cfg, [1, 17, 40, 33])
    kv_a = _filled_kv(cfg, torch.bfloat16, blocks)
    kv_b = _filled_kv(cfg, torch.bfloat16, blocks)
    hidden = native.pre_layer(fb.input_ids)
    assert hidden.dtype == torch.bfloat16
    want = hidden
    for i in range(cfg.num_layers):
        want = native.layer(i, want, fb, kv_a)
    got, _ = native.decode_layers(hidden, fb, kv_b)
    assert got.dtype == torch.bfloat16
    assert _rel(got, want) < 3e-2
    for a, b in zip(kv_a.k + kv_a.v, kv_b.k + kv_b.v):
        assert _rel(b, a) < 3e-2


@pytest.mark.parametrize("rows", [16, NATIVE_MAX_ROWS, NATIVE_MAX_ROWS + 1])
def test_decode_batches_past_native_max_rows_take_the_gemm(models, gemm_path, rows,
                                                          monkeypatch):
    """On every path with the cext GEMM a decode batch takes the fused decode-sized stages
    up to NATIVE_MAX_ROWS (the AVX2 path sent batches from 16 rows to the GEMM until its
    decode linear got a tile that fits 16 registers; then the fused step was 1.3-1.9x
    faster there), and past it the chunk stages and the model's own head (four projections
    a layer and the head through ``gemm``), not the one-call step. Either way the logits are the
    torch stages'."""
    cfg, native, plain = models
    isa = gemm_path
    monkeypatch.setattr(native.native, "gemm_isa", isa)
    monkeypatch.setattr(plain, "linear", torch.nn.functional.linear)
    calls = []
    real_gemm = cpu_kernels.gemm

    def counted_gemm(*a, **k):
        calls.append(k.get("isa"))
        return real_gemm(*a, **k)

    monkeypatch.setattr(cpu_kernels, "gemm", counted_gemm)
    fb, blocks = _decode_batch(cfg, [3 + 5 * (j % 7) for j in range(rows)])
    kv_n, kv_t = _filled_kv(cfg, torch.float32, blocks), _filled_kv(cfg, torch.float32, blocks)
    hidden = native.pre_layer(fb.input_ids)
    assert native.runs_decode_layers(hidden, fb) == (rows <= NATIVE_MAX_ROWS)
    got, want = hidden, hidden
    for i in range(cfg.num_layers):
        got = native.layer(i, got, fb, kv_n)
        want = plain.layer(i, want, fb, kv_t)
    _close(got, want)
    logits_n, logits_t = native.post_layer(got), plain.post_layer(want)
    _close(logits_n, logits_t, 1e-4)
    # the layers' projections on the path under test; the head on the model's own linear,
    # whose GEMM path was fixed when the model was built: this host's, which is torch's
    # F.linear for fp32 on an Intel AVX-512 host (prefill_gemm_isa), so no call here
    with monkeypatch.context() as build_time:
        build_time.setattr(cpu_kernels, "_default_isa", None)
        head_isa = cpu_kernels.prefill_gemm_isa()
    head_calls = [] if head_isa is None else [head_isa]
    assert calls == ([isa] * (4 * cfg.num_layers) + head_calls
                     if rows > NATIVE_MAX_ROWS else [])


def test_mixed_decode_logits_are_the_two_calls_logits(bf16_models, isa):
    """A bf16 model's one-call step rounds its last hidden rows to bf16 before the head, as
    they cross to a head of its own (and to the Dense Assist routes' GPU-side head): the
    logits are decode_layers then post_layer's, bit for bit, greedy tokens their argmax."""
    cfg, native, _, _ = bf16_models
    fb, blocks = _decode_batch(cfg, [6, 30, 1], seed=8)
    kv_a, kv_b = _filled_kv(cfg, torch.bfloat16, blocks), _filled_kv(cfg, torch.bfloat16, blocks)
    hidden = native.pre_layer(fb.input_ids)
    assert hidden.dtype == torch.bfloat16
    want = native.post_layer(native.decode_layers(hidden, fb, kv_a)[0][fb.logits_indices])
    got, greedy, _ = native.decode_logits(fb, kv_b, greedy=True)
    assert torch.equal(got, want) and greedy == want.argmax(dim=-1).tolist()
