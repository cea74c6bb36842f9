"""Dense Assist: the CPU worker hands a post-attention stage or the post-layer to the GPU
worker through shared memory (paper §4.2, §5).

State word: IDLE -> CPU_READY (CPU wrote the inputs) -> GPU_RUNNING -> GPU_DONE (GPU wrote
the outputs) -> IDLE. The CPU side spins briefly, then futex-waits; the GPU side notices
CPU_READY at its next stage boundary (or when its wake word rings while idle). The request
never changes owner: only activations cross, its KV stays in host memory.

With CPU tensor parallelism every CPU rank writes its own attention columns and "arrives";
the last to arrive raises CPU_READY. Every rank waits for DONE_SEQ to reach its call number
(so a DONE of the previous call is never mistaken for this one) and "departs" after reading
the outputs; the last to depart returns the word to IDLE. A rank arrives for call k+1 only
after it departed call k, so READY of k+1 always follows IDLE of k.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import msgspec
import torch

from dualpace.kernels.futex import FutexWord
from dualpace.runtime.layouts import (
    ASSIST_CPU_READY,
    ASSIST_GPU_DONE,
    ASSIST_GPU_FAILED,
    ASSIST_GPU_RUNNING,
    ASSIST_IDLE,
    OP_ECHO,
    OP_NEO_MID,
    OP_NEO_PRE,
    OP_POST_ATTN,
    OP_POST_ATTN_FINAL,
    OP_POST_LAYER,
    AssistLayout,
)
from dualpace.runtime.shm import process_alive
from dualpace.sampling.logprobs import TokenLogprobs
from dualpace.sampling.penalties import Penalties
from dualpace.sampling.sampler import SamplingRow

_EXTRAS = msgspec.msgpack.Encoder()
_EXTRAS_DEC = msgspec.msgpack.Decoder(list[tuple[int, Penalties, list[int]]])

SPIN = 4000  # pause iterations (~10-100 µs) before sleeping in the kernel


class PeerDied(RuntimeError):
    """The GPU worker died while a Dense Assist call was waiting on it."""


class AssistFailed(RuntimeError):
    """The GPU worker failed the call, or it timed out."""


class AssistChannel:
    """Both ends of the Dense Assist exchange of one CPU worker group with the GPU group."""

    def __init__(self, seg, layout: AssistLayout, base: int, gpu_wake: FutexWord):
        self.layout = layout
        w = {name: FutexWord(seg.buf, base + off) for name, off in (
            ("state", layout.STATE), ("op", layout.OP), ("layer", layout.LAYER),
            ("rows", layout.ROWS), ("call_seq", layout.CALL_SEQ),
            ("done_seq", layout.DONE_SEQ), ("arrive", layout.ARRIVE),
            ("depart", layout.DEPART))}
        self.state, self.op, self.layer, self.rows = w["state"], w["op"], w["layer"], w["rows"]
        self.call_seq, self.done_seq = w["call_seq"], w["done_seq"]
        self.arrive, self.depart = w["arrive"], w["depart"]
        self.buf = layout.views(seg, base)
        self.gpu_wake = gpu_wake
        self._calls = self.done_seq.load()  # this side's call count (every CPU rank agrees)
        self._posted_at = 0.0

    # --- CPU side -------------------------------------------------------------------------
    def call(self, op: int, layer: int, hidden: torch.Tensor | None,
             attn: torch.Tensor | None, rows: list[SamplingRow] | None,
             peer_alive: Callable[[], bool], timeout: float = 600.0, rank: int = 0,
             size: int = 1, waits: list[float] | None = None, positions=None, ids=None):
        """Run one assisted stage; returns hidden [b, H] (OP_POST_ATTN, OP_ECHO), the
        sampled tokens and their logprobs, (list[int], list[TokenLogprobs | None])
        (OP_POST_LAYER, OP_POST_ATTN_FINAL), or (hidden, q, k, v) with
        this rank's heads (OP_NEO_PRE, OP_NEO_MID). ``attn`` is this rank's columns of the
        attention output. ``waits`` (the profiler) gets the CPU-visible wait W: from
        publishing CPU-Ready to seeing GPU-Done, without the buffer movement on either side
        (Appendix B)."""
        b = self.post(op, layer, hidden, attn, rows, rank, size, positions, ids)
        return self.collect(op, b, peer_alive, timeout, rank, size, waits)

    def post(self, op: int, layer: int, hidden: torch.Tensor | None,
             attn: torch.Tensor | None, rows: list[SamplingRow] | None, rank: int = 0,
             size: int = 1, positions=None, ids=None) -> int:
        """The first half of a call: inputs in, CPU-Ready raised by the last rank to
        arrive; returns the batch rows. ``collect`` finishes it (the gated pipeline posts
        one sub-batch's call and attends over the other's KV meanwhile)."""
        b = self.stage_inputs(op, layer, hidden, attn, rows, rank, positions, ids)
        self._calls += 1
        self._posted_at = time.perf_counter()
        if self.arrive.add(1) == size:
            self.arrive.store(0)
            self.call_seq.store(self._calls)
            self.state.store(ASSIST_CPU_READY)
            self.gpu_wake.add(1)
            self.gpu_wake.wake()
        return b

    def collect(self, op: int, b: int, peer_alive: Callable[[], bool],
                timeout: float = 600.0, rank: int = 0, size: int = 1,
                waits: list[float] | None = None):
        """The second half of a call: wait for GPU-Done, read the outputs, depart."""
        self._wait_done(peer_alive, timeout)
        if waits is not None:
            waits.append(time.perf_counter() - self._posted_at)
        failed = self.state.load() == ASSIST_GPU_FAILED
        out = None if failed else self._outputs(op, b, rank, size)
        if self.depart.add(1) == size:
            self.depart.store(0)
            self.state.store(ASSIST_IDLE)
        if failed:
            raise AssistFailed("GPU worker failed the Dense Assist call")
        return out

    def _outputs(self, op: int, b: int, rank: int, size: int):
        if op in (OP_POST_ATTN, OP_ECHO):
            return self.buf["hidden_out"][:b].clone()
        if op in (OP_NEO_PRE, OP_NEO_MID):
            qc, kc = self.layout.attn_dim // size, self.layout.kv_dim // size
            return (self.buf["hidden_out"][:b].clone(),
                    self.buf["q_out"][:b, rank * qc:(rank + 1) * qc].clone(),
                    self.buf["k_out"][:b, rank * kc:(rank + 1) * kc].clone(),
                    self.buf["v_out"][:b, rank * kc:(rank + 1) * kc].clone())
        tokens = self.buf["tokens_out"][:b].tolist()
        return tokens, self._read_logprobs(b)

    def _read_logprobs(self, b: int) -> list[TokenLogprobs | None]:
        ks = self.buf["logprobs_k"][:b].tolist()
        if all(k < 0 for k in ks):
            return [None] * b
        vals, ids = self.buf["lp_out"][:b].tolist(), self.buf["lp_ids"][:b].tolist()
        return [None if k < 0 else TokenLogprobs(vals[i][0], tuple(ids[i][:k]),
                                                 tuple(vals[i][1:1 + k]))
                for i, k in enumerate(ks)]

    def write_outputs(self, tokens: list[int], lps: list[TokenLogprobs | None]) -> None:
        """GPU side of a sampling op: the tokens and, for rows that asked, their logprobs."""
        b = len(tokens)
        self.buf["tokens_out"][:b] = torch.tensor(tokens, dtype=torch.int64)
        for i, lp in enumerate(lps):
            if lp is not None:
                k = len(lp.top_ids)
                self.buf["lp_out"][i, 0] = lp.logprob
                self.buf["lp_out"][i, 1:1 + k] = torch.tensor(lp.top_logprobs)
                self.buf["lp_ids"][i, :k] = torch.tensor(lp.top_ids, dtype=torch.int64)

    def stage_inputs(self, op: int, layer: int, hidden: torch.Tensor | None,
                     attn: torch.Tensor | None, rows: list[SamplingRow] | None,
                     rank: int = 0, positions=None, ids=None) -> int:
        """Write one call's inputs into the buffer (rank 0 the shared ones, every rank its
        attention columns) and return its rows; the profiler stages inputs for
        ProfileAssist this way."""
        b = (hidden if hidden is not None else ids).shape[0]
        if b > self.layout.max_rows:
            raise ValueError(
                f"assist batch of {b} rows exceeds the buffer ({self.layout.max_rows})")
        if rank == 0:
            if hidden is not None:
                self.buf["hidden_in"][:b].copy_(hidden)
            if ids is not None:
                self.buf["ids_in"][:b].copy_(ids)
            if positions is not None:
                self.buf["pos_in"][:b].copy_(positions)
            if rows is not None:
                self._write_sampling(rows)
            self.op.store(op)
            self.layer.store(layer)
            self.rows.store(b)
        if attn is not None:
            cols = attn.shape[1]
            self.buf["attn_in"][:b, rank * cols:(rank + 1) * cols].copy_(attn)
        return b

    def _wait_done(self, peer_alive: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            done = self.done_seq.load()
            if done == self._calls:
                return
            if not self.done_seq.wait_while_equal(done, timeout=0.5, spin=SPIN):
                if not peer_alive():
                    raise PeerDied("GPU worker died during a Dense Assist call")
                if time.monotonic() > deadline:
                    raise AssistFailed(f"Dense Assist timed out after {timeout}s")

    def _write_sampling(self, rows: list[SamplingRow]) -> None:
        b = len(rows)
        self.buf["temperature"][:b] = torch.tensor([r.temperature for r in rows])
        self.buf["top_p"][:b] = torch.tensor([r.top_p for r in rows])
        self.buf["top_k"][:b] = torch.tensor([r.top_k for r in rows], dtype=torch.int32)
        self.buf["out_index"][:b] = torch.tensor([r.step for r in rows], dtype=torch.int32)
        self.buf["seed"][:b] = torch.tensor([r.seed for r in rows], dtype=torch.int64)
        self.buf["logprobs_k"][:b] = torch.tensor([r.logprobs for r in rows], dtype=torch.int32)
        extras = [(i, r.penalties, list(r.outputs)) for i, r in enumerate(rows) if r.penalties]
        raw = _EXTRAS.encode(extras) if extras else b""
        if len(raw) > self.buf["extras"].numel():
            raise ValueError(f"penalized rows need {len(raw)} bytes in the assist buffer, "
                             f"it has {self.buf['extras'].numel()}")
        if raw:
            self.buf["extras"][:len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        self.buf["extras_len"][0] = len(raw)

    # --- GPU side -------------------------------------------------------------------------
    def ready(self) -> bool:
        return self.state.load() == ASSIST_CPU_READY

    def claim(self) -> bool:
        """GPU rank 0 takes a waiting request (CPU_READY -> GPU_RUNNING)."""
        return self.state.compare_exchange(ASSIST_CPU_READY, ASSIST_GPU_RUNNING)

    def finish(self, ok: bool) -> None:
        """GPU rank 0 publishes the outputs (or the failure) of the claimed request."""
        self.state.store(ASSIST_GPU_DONE if ok else ASSIST_GPU_FAILED)
        self.done_seq.store(self.call_seq.load())
        self.done_seq.wake(1 << 30)

    def serve(self, run: Callable[[AssistChannel, int, int, int], None]) -> bool:
        """Single GPU rank: claim a waiting request, ``run(self, op, layer, rows)``, publish."""
        if not self.claim():
            return False
        ok = False
        try:
            run(self, self.op.load(), self.layer.load(), self.rows.load())
            ok = True
        finally:
            self.finish(ok)
        return True

    def sampling_rows(self, b: int) -> list[SamplingRow]:
        t = self.buf["temperature"][:b].tolist()
        p = self.buf["top_p"][:b].tolist()
        k = self.buf["top_k"][:b].tolist()
        idx = self.buf["out_index"][:b].tolist()
        seed = self.buf["seed"][:b].tolist()
        lk = self.buf["logprobs_k"][:b].tolist()
        pen: dict[int, tuple] = {}
        n = int(self.buf["extras_len"][0])
        if n:
            raw = self.buf["extras"][:n].numpy().tobytes()
            pen = {i: (p, tuple(out)) for i, p, out in _EXTRAS_DEC.decode(raw)}
        return [SamplingRow(t[i], p[i], k[i], seed[i], idx[i], lk[i], *pen.get(i, (None, ())))
                for i in range(b)]


def pid_alive(pid: int) -> Callable[[], bool]:
    return functools.partial(process_alive, pid)


def needs_group(op: int) -> bool:
    """Ops whose GPU work spans the tensor-parallel group: a sharded post-attention, or a
    QKV whose heads every rank computes its share of."""
    return op in (OP_POST_ATTN, OP_POST_ATTN_FINAL, OP_NEO_PRE, OP_NEO_MID)


__all__ = ["OP_ECHO", "OP_POST_ATTN", "OP_POST_ATTN_FINAL", "OP_POST_LAYER", "AssistChannel"]
