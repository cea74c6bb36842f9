"""Batch descriptors for the workers, built from committed plans (only diffs travel)."""

from __future__ import annotations

from dualpace.engine.gpu_round import GpuPlan, Move
from dualpace.engine.request import EngineRequest
from dualpace.runtime import protocol as P


def _all_tokens(r: EngineRequest) -> list[int]:
    return r.prompt + r.out


def _table_diff(r: EngineRequest, kind: str) -> tuple[list[int], bool]:
    known = r.known[kind]
    reset = known < 0
    new = list(r.blocks) if reset else r.blocks[known:]
    r.known[kind] = len(r.blocks)
    return new, reset


def decode_step(r: EngineRequest, kind: str) -> P.SeqStep:
    new, reset = _table_diff(r, kind)
    return P.SeqStep(req_id=r.rid, token_ids=[_all_tokens(r)[-1]], start_pos=r.num_tokens - 1,
                     new_blocks=new, reset=reset, out_index=len(r.out))


def prefill_step(r: EngineRequest, n: int) -> P.SeqStep:
    new, reset = _table_diff(r, "gpu")
    toks = _all_tokens(r)[r.computed:r.computed + n]
    return P.SeqStep(req_id=r.rid, token_ids=toks, start_pos=r.computed, new_blocks=new,
                     reset=reset, sample=r.computed + n == r.num_tokens, out_index=len(r.out))


def prefill_to_cpu_step(r: EngineRequest) -> P.SeqStep:
    return P.SeqStep(req_id=r.rid, token_ids=_all_tokens(r), start_pos=0,
                     host_blocks=list(r.blocks), out_index=len(r.out))


def _migration(m: Move) -> P.Migration:
    return P.Migration(req_id=m.req.rid, src_blocks=m.src, dst_blocks=m.dst,
                       num_tokens=m.num_tokens)


def gpu_batch(step_id: int, plan: GpuPlan) -> tuple[P.GpuBatch, list]:
    """The descriptor and, aligned with its seqs, what each row is: ("decode", r),
    ("prefill", r, n) or ("to_cpu", r)."""
    seqs, rows = [], []
    for r in plan.decodes:
        seqs.append(decode_step(r, "gpu"))
        rows.append(("decode", r))
    for r, n in plan.prefills:
        seqs.append(prefill_step(r, n))
        rows.append(("prefill", r, n))
    for r in plan.to_cpu:
        seqs.append(prefill_to_cpu_step(r))
        rows.append(("to_cpu", r))
    batch = P.GpuBatch(step_id=step_id, seqs=seqs,
                       swap_out=[_migration(m) for m in plan.swap_out],
                       swap_in=[_migration(m) for m in plan.swap_in])
    return batch, rows


def cpu_batch(step_id: int, reqs: list[EngineRequest], route: str = "",
              split: int = 0) -> P.CpuBatch:
    return P.CpuBatch(step_id=step_id, seqs=[decode_step(r, "cpu") for r in reqs], route=route,
                      split=split)
