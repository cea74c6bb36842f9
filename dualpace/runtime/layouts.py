"""Every shared-memory layout, declared once and imported by both sides (DESIGN.md §Processes).

    HostKVLayout   the host (CPU-tier) KV pool: per layer K then V, HND blocks
    RingLayout     one single-producer/single-consumer byte ring (batch descriptors, results)
    WakeLayout     one futex word per worker: "something for you" (ring record or assist)
    AssistLayout   one Dense Assist exchange of a CPU worker rank: state word + buffers (§4.2)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dualpace.sampling.params import MAX_LOGPROBS

ALIGN = 64  # cache line: no two processes' hot words share one


def _align(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class HostKVLayout:
    num_layers: int
    num_blocks: int
    num_kv_heads: int
    block_size: int
    head_dim: int
    dtype: str

    @property
    def block_shape(self) -> tuple[int, int, int]:
        return (self.num_kv_heads, self.block_size, self.head_dim)

    @property
    def layer_bytes(self) -> int:
        n = self.num_blocks * self.num_kv_heads * self.block_size * self.head_dim
        return _align(n * DTYPES[self.dtype].itemsize)

    @property
    def size(self) -> int:
        return 2 * self.num_layers * self.layer_bytes

    def views(self, seg, base: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-layer K and V of the region at ``base`` (one region per CPU TP rank, each
        holding that rank's KV heads: the pool is rank-sharded, §5)."""
        shape = (self.num_blocks, *self.block_shape)
        dt = DTYPES[self.dtype]
        lb = self.layer_bytes
        k = [seg.tensor(base + 2 * i * lb, shape, dt) for i in range(self.num_layers)]
        v = [seg.tensor(base + (2 * i + 1) * lb, shape, dt) for i in range(self.num_layers)]
        return k, v


def head_ranges(num_kv_heads: int, gpu_tp: int, cpu_tp: int, gpu_rank: int
                ) -> list[tuple[int, int, int, int, int]]:
    """Where GPU rank ``gpu_rank``'s KV heads live in the rank-sharded host pool:
    (cpu region, gpu-local first head, gpu-local end, region-local first head, region end)."""
    hg, hc = num_kv_heads // gpu_tp, num_kv_heads // cpu_tp
    out = []
    lo, hi = gpu_rank * hg, (gpu_rank + 1) * hg
    for c in range(cpu_tp):
        a, b = max(lo, c * hc), min(hi, (c + 1) * hc)
        if a < b:
            out.append((c, a - lo, b - lo, a - c * hc, b - c * hc))
    return out


@dataclass(frozen=True)
class RingLayout:
    """[tail u64][head u64] in the first cache line, then ``capacity`` bytes of records.
    A record is [u32 length][payload] padded to 8 bytes; length 0xFFFFFFFF marks a wrap."""

    capacity: int = 4 << 20
    TAIL = 0
    HEAD = 8
    HEADER = ALIGN

    @property
    def size(self) -> int:
        return self.HEADER + self.capacity


@dataclass(frozen=True)
class WakeLayout:
    num_workers: int

    def offset(self, index: int) -> int:
        return index * ALIGN

    @property
    def size(self) -> int:
        return max(1, self.num_workers) * ALIGN


# Dense Assist state machine (§5: CPU-Ready -> GPU-Running -> GPU-Done).
ASSIST_IDLE, ASSIST_CPU_READY, ASSIST_GPU_RUNNING, ASSIST_GPU_DONE, ASSIST_GPU_FAILED = range(5)
# Operations: one post-attention stage; the post-layer (+ sampling); the last layer's
# post-attention fused with the post-layer (Fused-Assist's final call); an echo of hidden_in
# into hidden_out that measures the handshake and buffer movement alone (profiler, benches).
# The gated (NEO-style) baseline's dense stages on the GPU: the embedding with layer 0's
# QKV (ids_in, pos_in -> hidden_out, q/k/v_out), and layer i's post-attention with layer
# i+1's QKV (hidden_in, attn_in, pos_in -> hidden_out, q/k/v_out).
OP_POST_ATTN, OP_POST_LAYER, OP_POST_ATTN_FINAL, OP_ECHO = 1, 2, 3, 4
OP_NEO_PRE, OP_NEO_MID = 5, 6
# Assist channels: Dense Assist uses the first; the gated baseline's two CPU sub-batches use
# one each, so one's dense work runs on the GPU while the CPU attends over the other's KV.
NUM_ASSIST_CHANNELS = 2


@dataclass(frozen=True)
class AssistLayout:
    max_rows: int
    hidden: int
    attn_dim: int  # the attention output width entering O projection (q heads x head_dim)
    kv_dim: int = 0  # k (and v) width of a QKV output (kv heads x head_dim; NEO ops)

    # state word, request fields, then the tensor-parallel counters: CPU ranks arriving with
    # their inputs / departing with the outputs, the call number and the last call done.
    STATE, OP, LAYER, ROWS, CALL_SEQ, DONE_SEQ, ARRIVE, DEPART = 0, 4, 8, 12, 16, 20, 24, 28

    def _fields(self) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        r = self.max_rows
        return [
            ("hidden_in", (r, self.hidden), torch.float32),
            ("attn_in", (r, self.attn_dim), torch.float32),
            ("hidden_out", (r, self.hidden), torch.float32),
            ("temperature", (r,), torch.float32),
            ("top_p", (r,), torch.float32),
            ("top_k", (r,), torch.int32),
            ("out_index", (r,), torch.int32),
            ("seed", (r,), torch.int64),
            ("tokens_out", (r,), torch.int64),
            ("logprobs_k", (r,), torch.int32),  # -1: none
            ("lp_out", (r, 1 + MAX_LOGPROBS), torch.float32),  # sampled, then the top k
            ("lp_ids", (r, MAX_LOGPROBS), torch.int64),
            # penalized rows' Penalties and outputs, msgpack-encoded (sampling/penalties.py)
            ("extras_len", (1,), torch.int32),
            ("extras", (max(1 << 20, r * 8192),), torch.uint8),
            ("ids_in", (r,), torch.int64),
            ("pos_in", (r,), torch.int64),
            ("q_out", (r, self.attn_dim), torch.float32),
            ("k_out", (r, self.kv_dim), torch.float32),
            ("v_out", (r, self.kv_dim), torch.float32),
        ]

    def offsets(self) -> dict[str, int]:
        off, out = ALIGN, {}
        for name, shape, dt in self._fields():
            out[name] = off
            n = 1
            for s in shape:
                n *= s
            off += _align(n * dt.itemsize)
        out["_end"] = off
        return out

    @property
    def size(self) -> int:
        return self.offsets()["_end"]

    def views(self, seg, base: int = 0) -> dict[str, torch.Tensor]:
        offs = self.offsets()
        return {name: seg.tensor(base + offs[name], shape, dt)
                for name, shape, dt in self._fields()}


@dataclass(frozen=True)
class TPControlLayout:
    """GPU tensor-parallel control: rank 0 publishes, at every stage boundary (and when it
    serves an assist while idle), whether the group joins a Dense Assist; the other ranks
    follow the same sequence of decisions. [head u32] then ``slots`` x [seq, kind, join]."""

    slots: int = 64
    HEAD = 0
    SLOT0 = ALIGN
    SLOT_BYTES = 16

    def slot(self, seq: int) -> int:
        return self.SLOT0 + (seq % self.slots) * self.SLOT_BYTES

    @property
    def size(self) -> int:
        return self.SLOT0 + self.slots * self.SLOT_BYTES
