"""The translator between the scheduler and the wire: committed plans become batch
descriptors (runtime/protocol.py), and only what a worker does not yet know travels: each
request's block-table diff against ``EngineRequest.known`` and its sampling parameters once.

The scheduler (engine/) decides in its own terms; this module is the one place that knows
the wire's."""

from __future__ import annotations

from dualpace.engine.gpu_round import GpuPlan, Move, StepRow
from dualpace.engine.request import EngineRequest
from dualpace.runtime import protocol as P
from dualpace.sampling.penalties import Penalties

WORKERS = ("gpu", "cpu")


class Translator:
    """Wire state of one engine: per worker group, which requests it has been introduced to
    and how much of each block table it holds. A table starts over (``reset``) where the
    request enters that pool afresh: the GPU at a prefill from position 0 (new or
    recomputed), the CPU at a swap-out or Prefill-to-CPU; a swap-in hands the GPU worker the
    migration's destination table whole."""

    def __init__(self, eos_ids: tuple[int, ...] = ()):
        self.eos_ids = eos_ids  # with stop_token_ids: what min_tokens holds back
        self._introduced: dict[str, set[int]] = {k: set() for k in WORKERS}
        self._known: dict[str, dict[int, int]] = {k: {} for k in WORKERS}  # rid -> blocks
        self._known_out: dict[str, dict[int, int]] = {k: {} for k in WORKERS}  # -> outputs

    def introductions(self, kind: str, reqs: list[EngineRequest]) -> list[P.NewRequest]:
        introduced, msgs = self._introduced[kind], []
        for r in reqs:
            if r.rid not in introduced:
                introduced.add(r.rid)
                p = r.params
                msgs.append(P.NewRequest(req_id=r.rid, sampling=P.SamplingSpec(
                    temperature=float(p.temperature), top_p=float(p.top_p), top_k=int(p.top_k),
                    seed=r.seed, logprobs=-1 if p.logprobs is None else p.logprobs,
                    prompt_logprobs=-1 if p.prompt_logprobs is None else p.prompt_logprobs,
                    penalties=self._penalties(r))))
        return msgs

    def _penalties(self, r: EngineRequest) -> Penalties | None:
        p = r.params
        if not p.penalized:
            return None
        stops = () if p.ignore_eos else self.eos_ids
        return Penalties(
            presence=float(p.presence_penalty), frequency=float(p.frequency_penalty),
            repetition=float(p.repetition_penalty), min_tokens=p.min_tokens,
            stop_ids=tuple(sorted(set(stops) | set(p.stop_token_ids))), bias=p.logit_bias,
            prompt=tuple(r.prompt) if p.repetition_penalty != 1.0 else ())

    def _outputs(self, r: EngineRequest, kind: str) -> dict:
        """A penalized request's outputs this worker has not been told yet."""
        if not r.params.penalized:
            return {}
        frm = self._known_out[kind].get(r.rid, 0)
        self._known_out[kind][r.rid] = len(r.out)
        return {"outputs": r.out[frm:], "outputs_from": frm}

    def releases(self, r: EngineRequest) -> list[tuple[str, P.Release]]:
        """(worker group, message) for every group that knows ``r``; forgets it."""
        out = []
        for k in WORKERS:
            self._known[k].pop(r.rid, None)
            self._known_out[k].pop(r.rid, None)
            if r.rid in self._introduced[k]:
                self._introduced[k].discard(r.rid)
                out.append((k, P.Release(req_ids=[r.rid])))
        return out

    def forget_all(self) -> None:
        """The workers restarted: nothing is known to them any more."""
        for k in WORKERS:
            self._known[k].clear()
            self._known_out[k].clear()
            self._introduced[k].clear()

    def _table_diff(self, r: EngineRequest, kind: str) -> tuple[list[int], bool]:
        known = self._known[kind].get(r.rid, -1)
        reset = known < 0
        new = list(r.blocks) if reset else r.blocks[known:]
        self._known[kind][r.rid] = len(r.blocks)
        return new, reset

    def _decode_step(self, r: EngineRequest, kind: str) -> P.SeqStep:
        new, reset = self._table_diff(r, kind)
        return P.SeqStep(req_id=r.rid, token_ids=[r.out[-1] if r.out else r.prompt[-1]],
                         start_pos=r.num_tokens - 1, new_blocks=new, reset=reset,
                         out_index=len(r.out), **self._outputs(r, kind))

    def _prefill_step(self, r: EngineRequest, n: int, forks) -> P.SeqStep:
        if r.computed == 0:
            self._known["gpu"][r.rid] = -1
        new, reset = self._table_diff(r, "gpu")
        toks = _all_tokens(r)[r.computed:r.computed + n]
        return P.SeqStep(req_id=r.rid, token_ids=toks, start_pos=r.computed, new_blocks=new,
                         reset=reset, sample=r.computed + n == r.num_tokens,
                         out_index=len(r.out), next_token=_next_token(r, r.computed + n),
                         forks=_forks(forks), **self._outputs(r, "gpu"))

    def _prefill_to_cpu_step(self, r: EngineRequest, forks) -> P.SeqStep:
        self._known["cpu"][r.rid] = -1
        return P.SeqStep(req_id=r.rid, token_ids=_all_tokens(r), start_pos=0,
                         host_blocks=list(r.blocks), out_index=len(r.out),
                         next_token=_next_token(r, r.num_tokens), forks=_forks(forks),
                         **self._outputs(r, "gpu"))

    def gpu_batch(self, step_id: int, plan: GpuPlan, rows: list[StepRow]) -> P.GpuBatch:
        """The descriptor of a committed GPU plan; its seqs follow ``rows``
        (``plan.step_rows()``, which the engine matches with the result's tokens)."""
        for m in plan.swap_out:
            self._known["cpu"][m.req.rid] = -1
        for m in plan.swap_in:
            self._known["gpu"][m.req.rid] = len(m.dst)
        seqs = []
        for row in rows:
            if row.kind == "decode":
                seqs.append(self._decode_step(row.req, "gpu"))
            elif row.kind == "prefill":
                seqs.append(self._prefill_step(row.req, row.tokens, row.forks))
            else:
                seqs.append(self._prefill_to_cpu_step(row.req, row.forks))
        return P.GpuBatch(step_id=step_id, seqs=seqs,
                          swap_out=[_migration(m) for m in plan.swap_out],
                          swap_in=[_migration(m) for m in plan.swap_in])

    def ahead_batch(self, step_id: int, plan: GpuPlan) -> P.GpuBatch:
        """The descriptor of a decode step submitted behind the one in flight
        (engine/lookahead.py): each row decodes the token that step samples for it, one
        position after it; the worker knows that token, the engine not yet."""
        seqs = []
        for r in plan.decodes:
            new, reset = self._table_diff(r, "gpu")
            seqs.append(P.SeqStep(req_id=r.rid, token_ids=[P.PREVIOUS_TOKEN],
                                  start_pos=r.num_tokens, new_blocks=new, reset=reset,
                                  out_index=len(r.out) + 1))
        return P.GpuBatch(step_id=step_id, seqs=seqs)

    def cpu_batch(self, step_id: int, reqs: list[EngineRequest], route: str = "",
                  split: int = 0) -> P.CpuBatch:
        return P.CpuBatch(step_id=step_id, seqs=[self._decode_step(r, "cpu") for r in reqs],
                          route=route, split=split)


def _all_tokens(r: EngineRequest) -> list[int]:
    return r.prompt + r.out


def _next_token(r: EngineRequest, end: int) -> int:
    """A prefill chunk ending before ``end``: -2 unless the request still needs prompt
    logprobs, else the token after the chunk (-1 at the prompt's end: the sampled token's
    logprob is the first output's, not a prompt one)."""
    if r.params.prompt_logprobs is None or r.prompt_logprobs_done:
        return -2
    return r.prompt[end] if end < len(r.prompt) else -1


def _forks(forks) -> list[P.Fork]:
    """Siblings whose blocks (in the pool the prompt's KV is written to) take a copy of it."""
    return [P.Fork(req_id=f.rid, blocks=list(f.blocks)) for f in forks]


def _migration(m: Move) -> P.Migration:
    return P.Migration(req_id=m.req.rid, src_blocks=m.src, dst_blocks=m.dst,
                       num_tokens=m.num_tokens)
