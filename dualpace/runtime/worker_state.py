"""What a worker remembers between steps: each request's sampling spec and block table in
the pool this worker executes over. Descriptors carry only diffs against it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dualpace.model.batch import ForwardBatch, SeqChunk, build_forward_batch
from dualpace.runtime.protocol import PREVIOUS_TOKEN, NewRequest, Release, SamplingSpec, SeqStep
from dualpace.sampling.sampler import SamplingRow


@dataclass
class WorkerRequest:
    sampling: SamplingSpec
    blocks: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)  # penalized requests only
    last_token: int = -1  # the token this worker sampled last for it (-1: none yet)
    last_index: int = -1  # ... and its out_index


class RequestTable:
    def __init__(self):
        self.requests: dict[int, WorkerRequest] = {}

    def add(self, msg: NewRequest) -> None:
        self.requests[msg.req_id] = WorkerRequest(msg.sampling)

    def release(self, msg: Release) -> None:
        for rid in msg.req_ids:
            self.requests.pop(rid, None)

    def get(self, req_id: int) -> WorkerRequest:
        try:
            return self.requests[req_id]
        except KeyError:
            raise ValueError(f"request {req_id} was never introduced to this worker") from None

    def apply_outputs(self, seqs: list[SeqStep]) -> None:
        """A penalized request's outputs, as far as this step's descriptor says (idempotent:
        ``outputs`` replace everything from ``outputs_from`` on)."""
        for s in seqs:
            if s.outputs or s.outputs_from:
                req = self.get(s.req_id)
                req.outputs[s.outputs_from:] = s.outputs

    def resolve_previous(self, seqs: list[SeqStep]) -> None:
        """A decode submitted ahead of its predecessor's result (``[PREVIOUS_TOKEN]``)
        takes the token this worker sampled for the request in that predecessor."""
        for s in seqs:
            if s.token_ids == [PREVIOUS_TOKEN]:
                req = self.get(s.req_id)
                if req.last_index != s.out_index - 1:  # e.g. that step failed
                    raise ValueError(
                        f"request {s.req_id}: a decode of output {s.out_index - 1}, which "
                        f"this worker did not sample (its last: {req.last_index})")
                s.token_ids = [req.last_token]
            elif PREVIOUS_TOKEN in s.token_ids:
                raise ValueError(f"request {s.req_id}: the previous token stands only alone")

    def record_sampled(self, seqs: list[SeqStep], tokens: list[int]) -> None:
        for s, t in zip(seqs, tokens):
            if s.sample and t >= 0:
                req = self.get(s.req_id)
                req.last_token, req.last_index = t, s.out_index

    def apply_blocks(self, seqs: list[SeqStep]) -> None:
        for s in seqs:
            req = self.get(s.req_id)
            if s.reset:
                req.blocks = list(s.new_blocks)
            else:
                req.blocks.extend(s.new_blocks)

    def set_blocks(self, req_id: int, blocks: list[int]) -> None:
        self.get(req_id).blocks = list(blocks)

    def sampling_rows(self, seqs: list[SeqStep]) -> list[SamplingRow]:
        rows = []
        for s in seqs:
            sp = self.get(s.req_id).sampling
            out = tuple(self.get(s.req_id).outputs[:s.out_index]) if sp.penalties else ()
            rows.append(SamplingRow(sp.temperature, sp.top_p, sp.top_k, sp.seed, s.out_index,
                                    sp.logprobs, sp.penalties, out))
        return rows

    def forward_batch(self, seqs: list[SeqStep], block_size: int,
                      device: torch.device) -> ForwardBatch:
        chunks = [SeqChunk(s.token_ids, s.start_pos, self.get(s.req_id).blocks) for s in seqs]
        return build_forward_batch(chunks, block_size, device)
