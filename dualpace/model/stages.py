"""The decoder as explicit stages (paper §2.1, Figure 2).

    pre-layer        token ids -> embeddings
    per layer i:
      pre-attention  RMSNorm, packed QKV, (q/k norm), RoPE, KV append      -> q
      attention      paged attention over the cached context              -> attn
      post-attention O proj + residual, RMSNorm, packed gate/up, SiLU*mul,
                     down proj + residual                                  -> hidden
    post-layer       final RMSNorm + LM head on the rows that sample      -> logits

The residual stream ``hidden`` is the only state carried between layers, so any prefix of
stages can run in one place and the rest elsewhere: the CPU worker hands post-attention
(hidden, attn) or post-layer (hidden rows) to Dense Assist (§4.2) without extra state.
Every stage takes a batch of rows and is device-agnostic torch code.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from dualpace.kernels.cpu import paged_decode_attention as _CEXT_DECODE
from dualpace.kv.cache import KVCache, write_kv
from dualpace.model.attention_ref import paged_decode_attention_ref, ragged_paged_attention
from dualpace.model.batch import ForwardBatch
from dualpace.model.config import ModelConfig
from dualpace.model.native_stages import (
    NATIVE_MAX_ROWS,
    NativeStages,
    native_stages_enabled,
    why_not_native,
)
from dualpace.model.rope import RotaryEmbedding
from dualpace.model.weights import ModelWeights

DecodeAttention = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
]
Linear = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]

# Decode-sized projections go to the cext weight-streaming kernel: measured on our machines
# (MKL on AMD EPYC) it beats torch's CPU GEMM by 1.5-4x up to 16 rows and still by 5-40% at
# 128; prefill chunks (hundreds of rows, compute-bound) stay with torch.
_CEXT_LINEAR_MAX_ROWS = 128


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Normalise in fp32 and scale in the compute dtype, in transformers' order.
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def default_decode_attention(device: torch.device) -> DecodeAttention:
    """The C kernel on CPU when it is built, else the torch reference."""
    if device.type == "cpu":
        from dualpace.kernels import cpu as cpu_kernels

        if cpu_kernels.available():
            return cpu_kernels.paged_decode_attention
    return paged_decode_attention_ref


def default_prefill_attention(device: torch.device):
    """On CPU with the cext built, kernels/prefill_attention.py's choice per call: the C
    causal kernel where the ISA path has it (the causal half of the scores: 2.1x torch's
    SDPA on a 256-token prompt, AVX2, Zen 1), else the torch reference; elsewhere the
    reference."""
    if device.type == "cpu":
        from dualpace.kernels import cpu as cpu_kernels

        if cpu_kernels.available():
            from dualpace.kernels import prefill_attention

            return prefill_attention.prefill_attention
    return ragged_paged_attention


ATTENTION_BACKENDS = ("torch", "triton", "flashinfer")


def attention_functions(backend: str, device: torch.device, cfg: ModelConfig | None = None,
                        block_size: int = 16):
    """(decode, prefill) attention for a backend: "torch" is the C kernels on CPU (when
    built; the scalar path's prefill is the reference's) or the torch reference; "triton" is
    model/attention_triton.py (CUDA, or CPU tensors under TRITON_INTERPRET=1), imported only
    when chosen: Triton decides at import whether its kernels are compiled or interpreted;
    "flashinfer" (CUDA) is one planned object for both, which takes the whole batch."""
    if backend == "flashinfer":
        from dualpace.model.attention_flashinfer import FlashInferAttention

        fi = FlashInferAttention(device, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                 block_size)
        return fi, fi
    if backend == "triton":
        from dualpace.model import attention_triton

        return attention_triton.paged_decode_attention, attention_triton.paged_prefill_attention
    if backend != "torch":
        raise ValueError(f"attention backend: expected one of {ATTENTION_BACKENDS}, "
                         f"got {backend!r}")
    return default_decode_attention(device), default_prefill_attention(device)


def default_linear(device: torch.device, dtype: torch.dtype) -> Linear:
    """fp32 projections on CPU through the cext kernels, decode-sized ones through the
    weight-streaming linear and prefill-sized ones through the GEMM where that is the
    faster (cpu_kernels.prefill_gemm_isa); else torch."""
    if device.type != "cpu" or dtype != torch.float32:
        return F.linear
    from dualpace.kernels import cpu as cpu_kernels

    if not cpu_kernels.available():
        return F.linear
    gemm_isa = cpu_kernels.prefill_gemm_isa()

    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if x.shape[0] > _CEXT_LINEAR_MAX_ROWS:
            if gemm_isa is None or not x.is_contiguous() or w.dtype != torch.float32:
                return F.linear(x, w, b)
            return cpu_kernels.gemm(x, w, b, isa=gemm_isa)
        if x.shape[-1] % 16 or not x.is_contiguous():
            return F.linear(x, w, b)
        return cpu_kernels.linear(x, w, b)

    return linear


class StagedModel:
    def __init__(
        self,
        cfg: ModelConfig,
        weights: ModelWeights,
        max_positions: int,
        decode_attention: DecodeAttention | None = None,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
        attention_backend: str = "torch",
        block_size: int = 16,
    ):
        """``cfg`` is this rank's view (``ModelConfig.shard``); ``all_reduce`` sums the
        row-parallel O and down projections over the tensor-parallel group (None: one rank);
        ``attention_backend``: see ``attention_functions`` (``decode_attention`` overrides
        its decode half)."""
        self.cfg = cfg
        self.w = weights
        self.device = weights.embed.device
        self.dtype = weights.embed.dtype
        self.rope = RotaryEmbedding(cfg.rope, cfg.head_dim, max_positions, self.dtype, self.device)
        self.scale = cfg.head_dim**-0.5
        decode, self.prefill_attention = attention_functions(attention_backend, self.device,
                                                             cfg, block_size)
        self.decode_attention = decode_attention or decode
        # Calls per attention implementation (its module), for Stats: which kernels served.
        self.attention_calls: dict[str, int] = {}
        # Called before each layer's attention (runtime/thread_share.py re-picks the thread
        # count there when two workers share the cores).
        self.layer_hook: Callable[[], object] | None = None
        # (the other tier's busy word, own share, every core) for the thread count that
        # decode_layers re-picks per layer in C, where layer_hook cannot run
        self.native_threads: tuple | None = None
        self.linear = default_linear(self.device, self.dtype)
        self.all_reduce = all_reduce or (lambda t: t)
        # Decode-sized batches on CPU run each dense stage as one C call (native_stages.py);
        # why_native says why not when they cannot.
        self.why_native = (why_not_native(cfg, weights, all_reduce is not None)
                           if native_stages_enabled() else "DUALPACE_NATIVE_STAGES=0")
        self.native = (NativeStages(cfg, weights, self.rope.cos, self.rope.sin)
                       if self.why_native is None else None)
        if self.native is not None and self.decode_attention is _CEXT_DECODE:
            self.decode_attention = self.native.decode_attention

    # --- stages --------------------------------------------------------------------------
    def pre_layer(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.w.embed)

    def _decode_sized(self, rows: int) -> bool:
        """Whether ``rows`` take the fused decode-sized native stages: up to NATIVE_MAX_ROWS,
        on every path (native_stages.py: the chunk stages' GEMMs win only above)."""
        return rows <= NATIVE_MAX_ROWS

    def _native_stage(self, rows: int, decode_sized, chunk, by_rows):
        """The native stage for ``rows`` (``decode_sized`` where ``_decode_sized``, else
        ``chunk``; a mixed-precision model's only where its dtype's torch GEMM lacks the
        CPU's arithmetic, ``NativeStages.slices_rows``: ``chunk`` on the cext GEMM,
        ``gemm_isa``, else ``by_rows``), or None: the torch stage (no native stages, no
        ``chunk`` for a stage, or a mixed-precision model's rows on a CPU with its
        arithmetic)."""
        if self.native is None:
            return None
        if self._decode_sized(rows):
            return decode_sized
        if not self.native.mixed:
            return chunk
        if not self.native.slices_rows:
            return None
        return chunk if chunk is not None and self.native.gemm_isa is not None else by_rows

    def pre_attention(
        self, i: int, hidden: torch.Tensor, batch: ForwardBatch, kv: KVCache
    ) -> torch.Tensor:
        if self.native is not None:
            stage = self._native_stage(hidden.shape[0], self.native.pre, self.native.pre_chunk,
                                       self.native.pre_rows)
            if stage is not None:
                return stage(i, hidden, batch.positions, batch.slot_mapping, kv.k[i], kv.v[i])
        q, k, v = self.qkv(i, hidden, batch.positions)
        self.append_kv(i, k, v, batch, kv)
        return q

    def qkv(self, i: int, hidden: torch.Tensor, positions: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The dense part of pre-attention: RMSNorm, packed QKV, (q/k norm), RoPE ->
        q [T, Hq, D], k and v [T, Hkv, D]. The gated baseline runs it on the GPU for
        CPU-resident rows (NEO: dense stages on the GPU, attention on the CPU)."""
        cfg, lw = self.cfg, self.w.layers[i]
        x = rms_norm(hidden, lw.input_norm, cfg.rms_norm_eps)
        qkv = self.linear(x, lw.qkv, lw.qkv_bias)
        q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        T = hidden.shape[0]
        q = q.view(T, cfg.num_heads, cfg.head_dim)
        k = k.view(T, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(T, cfg.num_kv_heads, cfg.head_dim)
        if lw.q_norm is not None:
            q = rms_norm(q, lw.q_norm, cfg.rms_norm_eps)
            k = rms_norm(k, lw.k_norm, cfg.rms_norm_eps)
        return self.rope.apply(q, positions), self.rope.apply(k, positions), v

    @staticmethod
    def append_kv(i: int, k: torch.Tensor, v: torch.Tensor, batch: ForwardBatch,
                  kv: KVCache) -> None:
        """The KV append of pre-attention: the step's k/v rows into layer i's blocks."""
        write_kv(kv.k[i], kv.v[i], k, v, batch.slot_mapping)

    def attention(self, i: int, q: torch.Tensor, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        if self.layer_hook is not None:
            self.layer_hook()
        decode = batch.is_decode
        fn = self.decode_attention if decode else self.prefill_attention
        key = fn.__module__
        self.attention_calls[key] = self.attention_calls.get(key, 0) + 1
        if getattr(fn, "wants_batch", False):  # FlashInfer: planned per batch
            out = fn(q, kv.k[i], kv.v[i], batch, self.scale)
        elif decode:
            out = fn(q, kv.k[i], kv.v[i], batch.block_tables, batch.seq_lens, self.scale)
        else:
            out = fn(q, kv.k[i], kv.v[i], batch.block_tables, batch.query_lens_list,
                     batch.seq_lens_list, self.scale)
        return out.reshape(q.shape[0], self.cfg.q_size)

    def post_attention(self, i: int, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            stage = self._native_stage(hidden.shape[0], self.native.post,
                                       self.native.post_chunk, self.native.post_rows)
            if stage is not None:
                return stage(i, hidden, attn)
        cfg, lw = self.cfg, self.w.layers[i]
        o = self.all_reduce(self.linear(attn, lw.o, None))
        hidden = hidden + (o if lw.o_bias is None else o + lw.o_bias)
        x = rms_norm(hidden, lw.post_norm, cfg.rms_norm_eps)
        gate, up = self.linear(x, lw.gate_up, None).chunk(2, dim=-1)
        return hidden + self.all_reduce(self.linear(F.silu(gate) * up, lw.down, None))

    def post_layer(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head on the sampling rows; logits in fp32."""
        if self.native is not None:
            # more rows than decode-sized: an fp32 model's head is torch's below (its linear
            # the cext GEMM where that is the faster), a mixed model's the chunk head
            chunk = self.native.final_chunk if self.native.mixed else None
            head = self._native_stage(hidden_rows.shape[0], self.native.final, chunk,
                                      self.native.final_rows)
            if head is not None:
                return head(hidden_rows)
        x = rms_norm(hidden_rows, self.w.final_norm, self.cfg.rms_norm_eps)
        return self.linear(x, self.w.lm_head, None).float()

    # --- compositions --------------------------------------------------------------------
    def runs_decode_layers(self, hidden: torch.Tensor, batch: ForwardBatch) -> bool:
        """Whether ``decode_layers`` runs this step (else it returns None)."""
        return self.runs_decode_rows(batch) and hidden.shape[0] == batch.num_rows

    def runs_decode_rows(self, batch: ForwardBatch) -> bool:
        """Whether the one-call decode step (``decode_layers``, ``decode_logits``) takes
        ``batch``: native stages with their attention, a decode batch they size."""
        return (self.native is not None
                and self.decode_attention == self.native.decode_attention
                and batch.is_decode and self._decode_sized(batch.num_rows))

    def decode_layers(self, hidden: torch.Tensor, batch: ForwardBatch, kv,
                      pause: tuple | None = None) -> tuple[torch.Tensor, float] | None:
        """Every layer of a decode step as one native call (native_stages.py): (hidden after
        the last layer, seconds in attention), or None where that call does not apply (no
        native stages, a prefill or a batch the GEMMs take, an attention other than
        the C kernel): the caller then runs ``layer`` by layer. Counts the attention calls
        as ``attention`` does. ``pause``: NativeStages.decode_layers' (words, value, serve)."""
        if not self.runs_decode_layers(hidden, batch):
            return None
        key = self.decode_attention.__module__
        self.attention_calls[key] = self.attention_calls.get(key, 0) + self.cfg.num_layers
        return self.native.decode_layers(hidden, batch, kv, self.scale, self.native_threads,
                                         pause)

    def decode_logits(self, batch: ForwardBatch, kv, pause: tuple | None = None,
                      greedy: bool = False) -> tuple[torch.Tensor, list[int] | None, float] | None:
        """``pre_layer``, ``decode_layers`` and ``post_layer`` of a decode batch as one native
        call (NativeStages.decode_logits): (fp32 logits [T, V], with ``greedy`` each row's
        argmax else None, seconds in attention), or None where ``decode_layers`` does not
        apply. A decode batch's rows are its sequences' last rows, so these are
        ``post_layer(hidden[batch.logits_indices])``'s logits."""
        if not self.runs_decode_rows(batch):
            return None
        key = self.decode_attention.__module__
        self.attention_calls[key] = self.attention_calls.get(key, 0) + self.cfg.num_layers
        return self.native.decode_logits(batch.input_ids, batch, kv, self.scale,
                                         self.native_threads, pause, greedy)

    def layer(self, i: int, hidden: torch.Tensor, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        q = self.pre_attention(i, hidden, batch, kv)
        return self.post_attention(i, hidden, self.attention(i, q, batch, kv))

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVCache) -> torch.Tensor:
        """Whole forward: logits [B, V] for the last row of every sequence."""
        fused = self.decode_logits(batch, kv)
        if fused is not None:
            return fused[0]
        hidden = self.pre_layer(batch.input_ids)
        for i in range(self.cfg.num_layers):
            hidden = self.layer(i, hidden, batch, kv)
        return self.post_layer(hidden[batch.logits_indices])
