"""The dense stages of a decode step as one native call each (cext/layer.c; §2.1, Fig. 2).

``StagedModel`` runs pre-attention, post-attention and the final norm + LM head through
here on CPU when the batch is decode-sized, so a layer costs three C calls (these two and
the paged attention) instead of two dozen torch dispatches: at batch 1 on a small model the
Python between kernels cost as much as the weights' DRAM reads (issue 14 item 2).

The stage boundaries stay where they are, so Dense Assist (§4.2) still hands
(hidden, attn) or the sampling rows to the GPU between any two calls, and the thread count
may change between them (runtime/thread_share.py). Sampling stays in sampling/sampler.py:
a few vector ops on the logits that carry the seeded, top-k/top-p and logprob paths, its
exponential race one C call on CPU.

Prefill chunks (more than ``NATIVE_MAX_ROWS`` rows) run compute-bound GEMMs, not the
weight-streaming kernel: cext/gemm.c on the AVX2 path (there 0.85-0.90 of the FMA peak
against MKL's 0.68-0.78 through torch, which the 1-stream TTFT of issue 14 paid), torch's
elsewhere (cpu_kernels.prefill_gemm_isa). The elementwise work between them (RMSNorm; q/k
norm, RoPE and KV append; SiLU * up) is one C call each, and the residual adds ride in the
GEMMs: a layer is then four GEMMs, attention and three short C calls instead of some thirty
torch ops. Each of those ops was an OpenMP parallel region whose team woke from sleep (the
short spin of runtime/supervisor.py):
a 256-token prefill of the llama.cpp comparison model took 97 ms with that spin against 86
without, and its elementwise ops a quarter of the step (issue 14's single-stream TTFT).

Decode batches take the fused decode-sized stages up to NATIVE_MAX_ROWS on every path, and
their head ``final``'s dp_norm_linear. Until 2026-12-07 the AVX2 path sent them to the chunk
stages and a GEMM head from 16 rows: its decode linear then spilled accumulators (a 4 x 4
tile on 16 registers) and lost to the GEMM 1.24-1.54x (Zen 1). With its 4 x 3 tile
(cext/linear_body.h) the linear beat the GEMM 1.0-1.2x at 16 rows and tied it at 32-64 (Zen
3, 2 threads), and the fused step ran 1.9x the chunk stages' tokens/s at batch 16, 1.35x at
32, 1.3-1.4x at 64, 1.0x at 128 (bench/decode_throughput.py --past-llc, a 177 MB fp32 model).

Used only where it computes what the torch stages compute up to rounding: CPU, no
tensor-parallel all-reduce, and projection widths that are multiples of 16. The C stages
compute in fp32; a bf16 or fp16 model (the CPU worker's default where the CPU has AMX,
resolved.py) keeps its weights, norms aside, and its KV cache in that dtype, which the
kernels read as stored, and its activations cross each stage's boundary in that dtype, as
the torch stages' do: converted to fp32 on entry and back on exit (a few KB a stage), so
Dense Assist, the rings and sampling see the same tensors either way. Such a model's prefill
chunks keep the torch stages (bf16 GEMMs: AMX through oneDNN), whose rounding they then
follow, where the CPU has that dtype's arithmetic. Where it has not (``slices_rows``: bf16
without AVX512_BF16, fp16 without AMX) torch's GEMM widens every element in software (on
the 2-core Zen 3 VM its bf16 linear ran 15-21 GFLOP/s on two threads, an eighth of the cext
GEMM), so no stage over more than NATIVE_MAX_ROWS rows goes there: pre and post (prefill
chunks, decode batches past 128 rows) take the chunk stages on the cext GEMM, which widens
W a tile at a time (cext/gemm_body.h) and runs at the fp32 GEMM's pace (0.90-1.10x its
time on the same weights in fp32), and so does the head over as many sampling rows
(``final_chunk``); on a path without the cext GEMM (scalar, or
$DUALPACE_PREFILL_GEMM=torch) they run the decode-sized stages NATIVE_MAX_ROWS rows a
call (``pre_rows``, ``post_rows``, ``final_rows``). Measured there (bench/mixed_precision_steps.py,
demo model in bf16, two threads, the workers' OpenMP spin), a 512-token prefill took 1361
ms through torch, 225 sliced and 186 on the GEMM (fp32: 178), a 200-row decode step over
128 tokens of context 566, 97 and 87 ms (fp32: 92). Without this a bf16 model
ran two dozen torch ops a layer: measured on a 2-core AMX VM (Intel Xeon), torch's bf16
linear at one row streams 23-29 GB/s against the kernel's 53.
``DUALPACE_NATIVE_STAGES=0`` turns it off (the torch stages then run everywhere).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from dualpace.kernels import cpu as cpu_kernels
from dualpace.model.config import ModelConfig
from dualpace.model.weights import ModelWeights

# Above this many rows (prefill chunks) torch's GEMM beats the weight-streaming kernel.
NATIVE_MAX_ROWS = 128


def torch_gemm_lacks_arithmetic(dtype: torch.dtype) -> bool:
    """Whether this CPU lacks the instructions torch's (oneDNN's) GEMM would use for
    ``dtype``: AVX512_BF16 for bf16, AVX512_FP16 for fp16 (not detected here; every CPU with
    AMX so far, Sapphire Rapids on, has it, so AMX stands for it). fp32: never. The
    hardware's, not the forced kernel path's (DUALPACE_CPU_ISA): torch does not follow it."""
    if dtype == torch.float32 or not cpu_kernels.available():
        return False
    feats = cpu_kernels.cpu_features()
    if dtype == torch.bfloat16:
        return not feats["avx512_bf16"]
    return not feats["amx_bf16"]


_DTYPE_CODES = cpu_kernels.DTYPE_CODES
_ERRORS = {-3: "positions: a position is outside the RoPE table",
           -4: "slot_mapping: a slot is outside the KV cache",
           -7: "input_ids: an id is outside the embedding"}


def native_stages_enabled() -> bool:
    flag = os.environ.get("DUALPACE_NATIVE_STAGES", "1").strip().lower()
    if flag not in ("0", "1", "false", "true", "off", "on", ""):
        raise ValueError(f"DUALPACE_NATIVE_STAGES: expected 0 or 1, got {flag!r}")
    return flag in ("1", "true", "on", "")


def why_not_native(cfg: ModelConfig, weights: ModelWeights, has_all_reduce: bool) -> str | None:
    """None when the native stages can serve this model, else the reason they cannot."""
    if not cpu_kernels.available():
        return "the C kernels are not built"
    if weights.embed.device.type != "cpu":
        return "not a CPU model"
    if weights.embed.dtype not in _DTYPE_CODES or weights.layers[0].qkv.dtype not in _DTYPE_CODES:
        return f"compute dtype {weights.embed.dtype}"
    if has_all_reduce:
        return "tensor parallel (the all-reduces sit inside the stages)"
    for name, n in (("hidden size", cfg.hidden_size), ("q width", cfg.q_size),
                    ("intermediate size", cfg.intermediate_size)):
        if n % 16:
            return f"{name} {n} is not a multiple of 16"
    if cfg.head_dim % 2:
        return f"odd head_dim {cfg.head_dim}"
    return None


def _ptr(ffi, t: torch.Tensor | None, ctype: str = "float *"):
    return ffi.NULL if t is None else ffi.cast(ctype, t.data_ptr())


def _isa_code() -> int:
    return cpu_kernels.ISAS[cpu_kernels.resolve_isa()]


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float().contiguous()


class NativeStages:
    def __init__(self, cfg: ModelConfig, weights: ModelWeights, cos: torch.Tensor,
                 sin: torch.Tensor):
        """``cfg`` and ``weights``: this rank's model (see ``why_not_native``); cos/sin: the
        RoPE tables [max_positions, head_dim] of model/rope.py."""
        self.ffi, self.lib = cpu_kernels.require()
        ffi = self.ffi
        self.cfg = cfg
        self.w = weights
        # the dtype of the activations at the stage boundaries (the model's compute dtype);
        # mixed: the C stages convert them to and from fp32, and prefill chunks stay torch's
        self.act_dtype = weights.embed.dtype
        self.mixed = self.act_dtype != torch.float32
        # more rows than decode-sized through the decode-sized stages, a slice at a time,
        # where torch's GEMM in the model's dtype would widen every element in software
        self.slices_rows = self.mixed and torch_gemm_lacks_arithmetic(self.act_dtype)
        # Everything C points at is kept alive here for the model's life.
        self._keep: list[torch.Tensor] = [cos.float().contiguous(), sin.float().contiguous()]
        m = ffi.new("dp_layer_dims *")
        m.hidden, m.num_heads, m.num_kv_heads = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads
        m.head_dim, m.intermediate = cfg.head_dim, cfg.intermediate_size
        m.max_positions = cos.shape[0]
        m.w_dtype = _DTYPE_CODES[weights.layers[0].qkv.dtype]
        m.eps = cfg.rms_norm_eps
        m.cos, m.sin = _ptr(ffi, self._keep[0]), _ptr(ffi, self._keep[1])
        self.dims = m
        # the prefill chunks' projections: the cext GEMM where it is the faster
        # (cpu_kernels.prefill_gemm_isa), else torch's (None); a mixed model's only where
        # torch's would widen its weights in software (``slices_rows``), since elsewhere
        # its chunks keep the torch stages
        w_dtype = weights.layers[0].qkv.dtype
        self.gemm_isa = (cpu_kernels.prefill_gemm_isa(w_dtype)
                         if not self.mixed or self.slices_rows else None)
        self.layers = []
        # each layer's (QKV, O) biases in fp32, for the chunk stages' GEMMs too
        self.biases = [(_f32(lw.qkv_bias), _f32(lw.o_bias)) for lw in weights.layers]
        for lw, (qkv_bias, o_bias) in zip(weights.layers, self.biases):
            s = ffi.new("dp_layer_weights *")
            for field, t, ctype in (
                ("input_norm", _f32(lw.input_norm), "float *"),
                ("qkv", lw.qkv.contiguous(), "void *"),
                ("qkv_bias", qkv_bias, "float *"),
                ("q_norm", _f32(lw.q_norm), "float *"),
                ("k_norm", _f32(lw.k_norm), "float *"),
                ("o", lw.o.contiguous(), "void *"),
                ("o_bias", o_bias, "float *"),
                ("post_norm", _f32(lw.post_norm), "float *"),
                ("gate_up", lw.gate_up.contiguous(), "void *"),
                ("down", lw.down.contiguous(), "void *"),
            ):
                if t is not None:
                    self._keep.append(t)
                setattr(s, field, _ptr(ffi, t, ctype))
            self.layers.append(s)
        # the same weights again as one array, for dp_decode_layers
        self.layer_array = ffi.new("dp_layer_weights[]", len(self.layers))
        for i, lw in enumerate(self.layers):
            self.layer_array[i] = lw[0]
        self._decode_models: dict[tuple, object] = {}
        self.final_norm = _f32(weights.final_norm)
        self.lm_head = weights.lm_head.contiguous()
        self.embed = weights.embed.contiguous()
        self._keep += [self.final_norm, self.lm_head, self.embed]
        self._scratch = torch.empty(0, dtype=torch.float32)
        # dp_decode_layers' scratch a row (q, attention out, the stages' work) and its
        # out-parameters, made once: a step's Python runs on cold caches
        self._decode_scratch_per_row = 2 * cfg.num_heads * cfg.head_dim + max(
            cfg.hidden_size + cfg.q_size + 2 * cfg.kv_size,
            2 * cfg.hidden_size + 3 * cfg.intermediate_size)
        self._decode_out = (ffi.new("double *"), ffi.new("int *"))

    def _in(self, t: torch.Tensor) -> torch.Tensor:
        """An activation as the C stages take it: fp32, contiguous."""
        return t.float().contiguous() if t.dtype != torch.float32 else t.contiguous()

    def _out(self, t: torch.Tensor) -> torch.Tensor:
        """A C stage's fp32 activation in the model's boundary dtype."""
        return t.to(self.act_dtype) if self.mixed else t

    def _scratch_for(self, floats: int) -> torch.Tensor:
        if self._scratch.numel() < floats:
            self._scratch = torch.empty(floats, dtype=torch.float32)
        return self._scratch

    def _cache_dims(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int]:
        """(num_blocks, block_size) of one layer's HND caches, checked against the model."""
        nb, hkv, bs, d = k_cache.shape
        if (hkv, d) != (self.cfg.num_kv_heads, self.cfg.head_dim) or v_cache.shape != k_cache.shape:
            raise ValueError(f"KV cache shape {tuple(k_cache.shape)} does not match the model")
        return nb, bs

    def pre(self, i: int, hidden: torch.Tensor, positions: torch.Tensor,
            slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """RMSNorm, packed QKV, q/k norm, RoPE, KV append -> q [T, Hq, D]."""
        cfg, ffi = self.cfg, self.ffi
        T = hidden.shape[0]
        nb, bs = self._cache_dims(k_cache, v_cache)
        hidden = self._in(hidden)
        positions, slots = positions.contiguous(), slots.contiguous()
        q = torch.empty(T, cfg.num_heads, cfg.head_dim, dtype=torch.float32)
        scratch = self._scratch_for(T * (cfg.hidden_size + cfg.q_size + 2 * cfg.kv_size))
        rc = self.lib.dp_layer_pre(
            self.dims, self.layers[i], _ptr(ffi, hidden), T,
            _ptr(ffi, positions, "int64_t *"), _ptr(ffi, slots, "int64_t *"),
            _ptr(ffi, k_cache, "void *"), _ptr(ffi, v_cache, "void *"),
            _DTYPE_CODES[k_cache.dtype], nb, bs, _ptr(ffi, q), _ptr(ffi, scratch),
            _isa_code(), cpu_kernels.num_threads())
        if rc:
            raise ValueError(_ERRORS.get(rc, f"dp_layer_pre failed with code {rc}"))
        return self._out(q)

    # --- prefill chunks: GEMMs (``_project``), the elementwise phases in C ----------------
    def _norm_rows(self, x: torch.Tensor, norm) -> torch.Tensor:
        T, H = x.shape
        out = torch.empty_like(x)
        rc = self.lib.dp_rms_norm_rows(_ptr(self.ffi, x), T, H, norm, self.cfg.rms_norm_eps,
                                       _ptr(self.ffi, out), cpu_kernels.num_threads())
        if rc:
            raise ValueError(f"dp_rms_norm_rows failed with code {rc}")
        return out

    def pre_chunk(self, i: int, hidden: torch.Tensor, positions: torch.Tensor,
                  slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
                  ) -> torch.Tensor:
        """``pre`` for a prefill chunk: RMSNorm (C), the QKV GEMM, q/k norm, RoPE
        and KV append (C) -> q [T, Hq, D]. A ``mixed`` model's chunks come here only on the
        cext GEMM (``gemm_isa``), which multiplies its weights in fp32; their boundaries
        are in its dtype, as ``pre``'s."""
        cfg, ffi, lw = self.cfg, self.ffi, self.w.layers[i]
        T = hidden.shape[0]
        nb, bs = self._cache_dims(k_cache, v_cache)
        positions, slots = positions.contiguous(), slots.contiguous()
        x = self._norm_rows(self._in(hidden), self.layers[i].input_norm)
        qkv = self._project(x, lw.qkv, self.biases[i][0])
        q = torch.empty(T, cfg.num_heads, cfg.head_dim, dtype=torch.float32)
        rc = self.lib.dp_qkv_rope_append(
            self.dims, self.layers[i], _ptr(ffi, qkv), T,
            _ptr(ffi, positions, "int64_t *"), _ptr(ffi, slots, "int64_t *"),
            _ptr(ffi, k_cache, "void *"), _ptr(ffi, v_cache, "void *"),
            _DTYPE_CODES[k_cache.dtype], nb, bs, _ptr(ffi, q), cpu_kernels.num_threads())
        if rc:
            raise ValueError(_ERRORS.get(rc, f"dp_qkv_rope_append failed with code {rc}"))
        return self._out(q)

    def post_chunk(self, i: int, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """``post`` for a prefill chunk: O GEMM + residual (one GEMM), RMSNorm (C), the
        gate/up GEMM, SiLU * up (C), the down GEMM + residual (in place). A ``mixed``
        model's as ``pre_chunk``'s."""
        ffi, lw = self.ffi, self.w.layers[i]
        T = hidden.shape[0]
        out = self._project(self._in(attn), lw.o, self.biases[i][1], add=self._in(hidden))
        x = self._norm_rows(out, self.layers[i].post_norm)
        gate_up = self._project(x, lw.gate_up)
        act = torch.empty(T, self.cfg.intermediate_size, dtype=torch.float32)
        rc = self.lib.dp_silu_mul_rows(_ptr(ffi, gate_up), T, self.cfg.intermediate_size,
                                       _ptr(ffi, act), _isa_code(), cpu_kernels.num_threads())
        if rc:
            raise ValueError(f"dp_silu_mul_rows failed with code {rc}")
        return self._out(self._project(act, lw.down, add=out, out=out))

    def _project(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                 add: torch.Tensor | None = None, out: torch.Tensor | None = None
                 ) -> torch.Tensor:
        """``add + x @ w.T + bias`` for a prefill chunk (``out``: where, may be ``add``):
        the cext GEMM on ``gemm_isa``, else torch's."""
        if self.gemm_isa is not None:
            return cpu_kernels.gemm(x.contiguous(), w, bias, add, out=out, isa=self.gemm_isa)
        if add is None:
            return F.linear(x, w, bias)
        if out is add:
            out = add.addmm_(x, w.t())
        else:
            out = torch.addmm(add, x, w.t())
        return out if bias is None else out.add_(bias)

    def decode_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         block_tables: torch.Tensor, seq_lens: torch.Tensor,
                         scale: float) -> torch.Tensor:
        """The C paged attention for q from ``pre`` and the model's caches, without the
        wrapper's full validation each layer: the checks here are attribute reads, and
        anything unusual takes the validating wrapper (``decode_attention`` of stages.py)."""
        B = q.shape[0]
        if (q.dtype != self.act_dtype or q.dim() != 3 or not q.is_contiguous()
                or q.shape[1:] != (self.cfg.num_heads, k_cache.shape[-1])
                or k_cache.dtype != v_cache.dtype or k_cache.shape != v_cache.shape
                or not k_cache.is_contiguous() or not v_cache.is_contiguous()
                or block_tables.dtype != torch.int32 or seq_lens.dtype != torch.int32
                or not block_tables.is_contiguous() or not seq_lens.is_contiguous()
                or block_tables.shape[0] != B or seq_lens.shape[0] != B
                or block_tables.shape[1] == 0):
            return cpu_kernels.paged_decode_attention(q, k_cache, v_cache, block_tables,
                                                      seq_lens, scale)
        return cpu_kernels.paged_decode_attention_checked(q, k_cache, v_cache, block_tables,
                                                          seq_lens, scale)

    # --- more rows than decode-sized, a slice at a time (``slices_rows``) ----------------
    def pre_rows(self, i: int, hidden: torch.Tensor, positions: torch.Tensor,
                 slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
                 ) -> torch.Tensor:
        """``pre`` over any number of rows, NATIVE_MAX_ROWS a call (each row's RoPE and KV
        append are its own, so the slices' order does not matter)."""
        n = NATIVE_MAX_ROWS
        return torch.cat([self.pre(i, hidden[r:r + n], positions[r:r + n], slots[r:r + n],
                                   k_cache, v_cache) for r in range(0, hidden.shape[0], n)])

    def post_rows(self, i: int, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """``post`` over any number of rows, NATIVE_MAX_ROWS a call."""
        n = NATIVE_MAX_ROWS
        return torch.cat([self.post(i, hidden[r:r + n], attn[r:r + n])
                          for r in range(0, hidden.shape[0], n)])

    def final_chunk(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        """``final`` for more than NATIVE_MAX_ROWS rows of a ``mixed`` model on the cext GEMM
        (``gemm_isa``): the RMSNorm (C), then the LM head as one GEMM -> fp32 logits [T, V].
        An fp32 model's head of as many rows is the torch stage's, whose linear is this
        GEMM where ``gemm_isa`` says so (stages.default_linear)."""
        x = self._norm_rows(self._in(hidden_rows), _ptr(self.ffi, self.final_norm))
        return self._project(x, self.lm_head)

    def final_rows(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        """``final`` over any number of rows, NATIVE_MAX_ROWS a call."""
        n = NATIVE_MAX_ROWS
        return torch.cat([self.final(hidden_rows[r:r + n])
                          for r in range(0, hidden_rows.shape[0], n)])

    def post(self, i: int, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """O proj + residual, RMSNorm, gate/up, SiLU * up, down + residual -> hidden."""
        cfg, ffi = self.cfg, self.ffi
        T = hidden.shape[0]
        hidden, attn = self._in(hidden), self._in(attn)
        out = torch.empty_like(hidden)
        scratch = self._scratch_for(T * (2 * cfg.hidden_size + 3 * cfg.intermediate_size))
        rc = self.lib.dp_layer_post(
            self.dims, self.layers[i], _ptr(ffi, hidden), _ptr(ffi, attn), T, _ptr(ffi, out),
            _ptr(ffi, scratch), _isa_code(),
            cpu_kernels.num_threads())
        if rc:
            raise ValueError(f"dp_layer_post failed with code {rc}")
        return self._out(out)

    def _decode_model(self, kv, scale: float):
        """The dp_decode_model of ``kv``'s per-layer caches, built once per set of caches
        (keyed by their addresses: equal keys point at the same memory)."""
        k0 = kv.k[0]
        key = (tuple(t.data_ptr() for t in kv.k), tuple(t.data_ptr() for t in kv.v),
               tuple(k0.shape), k0.dtype, scale)
        dm = self._decode_models.get(key)
        if dm is None:
            ffi = self.ffi
            nb, bs = self._cache_dims(k0, kv.v[0])
            for k, v in zip(kv.k, kv.v):
                if (k.shape != k0.shape or v.shape != k0.shape or k.dtype != k0.dtype
                        or v.dtype != k0.dtype or not k.is_contiguous()
                        or not v.is_contiguous()):
                    raise ValueError("KV cache: every layer's K and V must be contiguous "
                                     "caches of one shape and dtype")
            ks = ffi.new("void *[]", [_ptr(ffi, t, "void *") for t in kv.k])
            vs = ffi.new("void *[]", [_ptr(ffi, t, "void *") for t in kv.v])
            dm = ffi.new("dp_decode_model *")
            dm.m, dm.layers, dm.n_layers = self.dims, self.layer_array, len(self.layers)
            dm.k_caches, dm.v_caches = ks, vs
            dm.kv_dtype, dm.num_blocks, dm.BS, dm.scale = _DTYPE_CODES[k0.dtype], nb, bs, scale
            dm.final_norm = _ptr(ffi, self.final_norm)
            dm.lm_head = _ptr(ffi, self.lm_head, "void *")
            dm.lm_dtype, dm.vocab = _DTYPE_CODES[self.lm_head.dtype], self.lm_head.shape[0]
            dm.embed = _ptr(ffi, self.embed, "void *")
            dm.embed_dtype, dm.embed_rows = _DTYPE_CODES[self.embed.dtype], self.embed.shape[0]
            if len(self._decode_models) >= 8:  # a worker has one or two; tests make many
                self._decode_models.clear()
            dm = self._decode_models[key] = (dm, ks, vs)
        return dm[0]

    def decode_logits(self, input_ids: torch.Tensor, batch, kv, scale: float,
                      threads: tuple | None = None, pause: tuple | None = None,
                      greedy: bool = False
                      ) -> tuple[torch.Tensor, list[int] | None, float]:
        """The embedding of ``input_ids`` [T], ``decode_layers`` and ``final`` of every row
        in the same native call: (fp32 logits [T, V], with ``greedy`` each row's argmax
        (cext/argmax.c, as sampling's greedy_tokens gives it) else None, seconds in
        attention). One call where there were three or four with Python between them: that
        Python ran on caches the step's weight stream had just flushed (~0.4 ms a step on a
        2-core Zen 4, against ~30 us warm), and the kernels' threads (then OpenMP's) fell
        asleep in it, whose wake-up then waited for a core the engine had taken. The head
        is ``final``'s decode-sized path (dp_norm_linear) on the hidden rows rounded to the
        model's activation dtype as they cross to it (a bf16 model's), so the logits are the
        same."""
        T = int(input_ids.shape[0])
        if input_ids.dtype != torch.int64 or input_ids.dim() != 1:
            raise ValueError("decode_logits: input ids as an int64 vector")
        hidden = torch.empty(T, self.cfg.hidden_size, dtype=torch.float32)
        logits = torch.empty(T, self.lm_head.shape[0], dtype=torch.float32)
        tokens = torch.empty(T, dtype=torch.int64) if greedy else None
        _, seconds = self._decode(hidden, batch, kv, scale, threads, pause,
                                  (logits, tokens, input_ids.contiguous()))
        return logits, None if tokens is None else tokens.tolist(), seconds

    def decode_layers(self, hidden: torch.Tensor, batch, kv, scale: float,
                      threads: tuple | None = None, pause: tuple | None = None
                      ) -> tuple[torch.Tensor, float]:
        """Every layer of a decode step in one call (cext/decode_layers.c): hidden [T, H]
        after the last layer, and the seconds spent in attention. ``threads``: (the other
        tier's busy word, this worker's share, every core) of runtime/thread_share.py, the
        count re-picked per layer; None: this process's thread count throughout.
        ``pause``: (words, value, serve): after a layer with more to go, when one of the
        FutexWords holds value the call returns, serve() runs (the GPU worker's stage
        boundary, which serves a waiting Dense Assist request) and the next call goes on
        from the next layer, on the same fp32 hidden rows."""
        # a copy: the call works in place
        hidden = (hidden.float().contiguous() if hidden.dtype != torch.float32
                  else hidden.contiguous().clone())
        return self._decode(hidden, batch, kv, scale, threads, pause, None)

    def _decode(self, hidden, batch, kv, scale, threads, pause, head):
        """dp_decode_layers on fp32 ``hidden`` [T, H] (in place), until every layer ran;
        ``head``: (logits, greedy tokens or None, input ids) for decode_logits."""
        ffi = self.ffi
        T = hidden.shape[0]
        bt, sl = batch.block_tables, batch.seq_lens
        if (bt.dtype != torch.int32 or sl.dtype != torch.int32 or bt.shape[0] != T
                or not bt.is_contiguous() or not sl.is_contiguous()):
            raise ValueError("decode_layers: a decode batch's int32 block tables and lengths")
        positions = batch.positions.contiguous()
        slots = batch.slot_mapping.contiguous()
        scratch = self._scratch_for(T * self._decode_scratch_per_row)
        dm = self._decode_model(kv, scale)
        words, value, serve = pause if pause is not None else ((), 0, None)
        word_ptrs = ffi.new("uint32_t *[]", [w.address for w in words]) if words else ffi.NULL
        seconds, done = self._decode_out
        logits, greedy, ids = head if head is not None else (None, None, None)
        logits_p, greedy_p = _ptr(ffi, logits), _ptr(ffi, greedy, "int64_t *")
        total_seconds, begin = 0.0, 0
        while True:
            n = cpu_kernels.num_threads()
            peer, own, total = threads if threads is not None else (ffi.NULL, n, n)
            rc = self.lib.dp_decode_layers(
                dm, _ptr(ffi, hidden), T, _ptr(ffi, positions, "int64_t *"),
                _ptr(ffi, slots, "int64_t *"), _ptr(ffi, bt, "int32_t *"), bt.shape[1],
                _ptr(ffi, sl, "int32_t *"), _ptr(ffi, scratch), peer, own, total, _isa_code(),
                seconds, begin, word_ptrs, len(words), value, done, logits_p, greedy_p,
                _ptr(ffi, ids if begin == 0 else None, "int64_t *"))
            if rc:
                if rc in (-15, -5):
                    raise MemoryError("decode_layers: out of memory for scratch")
                if rc <= -10:
                    name, why = cpu_kernels.ATTENTION_ERRORS.get(
                        rc + 10, ("kernel", f"attention failed with code {rc + 10}"))
                    raise ValueError(f"{name}: {why}")
                raise ValueError(_ERRORS.get(rc, f"dp_decode_layers failed with code {rc}"))
            total_seconds += seconds[0]
            begin = done[0]
            if begin >= len(self.layers):
                return self._out(hidden), total_seconds
            serve()

    def final(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        """Final RMSNorm + LM head -> fp32 logits [T, V] (T <= NATIVE_MAX_ROWS: more rows
        take the torch head, StagedModel.post_layer)."""
        ffi = self.ffi
        T, H = hidden_rows.shape
        hidden_rows = self._in(hidden_rows)
        out = torch.empty(T, self.lm_head.shape[0], dtype=torch.float32)
        rc = self.lib.dp_norm_linear(
            _ptr(ffi, hidden_rows), T, H, _ptr(ffi, self.final_norm), self.cfg.rms_norm_eps,
            _ptr(ffi, self.lm_head, "void *"), _DTYPE_CODES[self.lm_head.dtype],
            self.lm_head.shape[0], _ptr(ffi, out), _ptr(ffi, self._scratch_for(T * H)),
            _isa_code(), cpu_kernels.num_threads())
        if rc:
            raise ValueError(f"dp_norm_linear failed with code {rc}")
        return out
