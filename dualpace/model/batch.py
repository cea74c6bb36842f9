"""Per-step batch metadata shared by every stage of one forward (paper §2.1, Fig. 2).

A batch is a ragged list of sequences; sequence i contributes ``query_lens[i]`` token rows
(a prompt chunk during prefill, one row during decode) whose positions start at
``seq_lens[i] - query_lens[i]``. Rows are flattened to [T] in sequence order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SeqChunk:
    """One sequence's rows in a step: new token ids, the position of the first, its blocks."""

    token_ids: list[int]
    start_pos: int
    block_ids: list[int]


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64, block * block_size + offset
    block_tables: torch.Tensor  # [B, max_blocks] int32 (padded with 0)
    seq_lens: torch.Tensor  # [B] int32, context length including this step's rows
    logits_indices: torch.Tensor  # [B] int64, the last row of each sequence
    query_lens_list: list[int]  # host copies: the reference prefill loops over them
    seq_lens_list: list[int]
    block_ids_list: list[list[int]] | None = None  # host copy of the tables (FlashInfer plans)

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @functools.cached_property
    def is_decode(self) -> bool:  # asked once per layer: computed once per batch
        return all(q == 1 for q in self.query_lens_list)


def build_forward_batch(
    chunks: list[SeqChunk], block_size: int, device: torch.device | str = "cpu"
) -> ForwardBatch:
    if not chunks:
        raise ValueError("empty batch")
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    qlens: list[int] = []
    slens: list[int] = []
    last: list[int] = []
    max_blocks = max(len(c.block_ids) for c in chunks)
    for c in chunks:
        n = len(c.token_ids)
        end = c.start_pos + n
        if n == 0 or end > len(c.block_ids) * block_size:
            raise ValueError(
                f"sequence chunk of {n} tokens ending at {end} does not fit its blocks"
            )
        ids += c.token_ids
        for p in range(c.start_pos, end):
            positions.append(p)
            slots.append(c.block_ids[p // block_size] * block_size + p % block_size)
        qlens.append(n)
        slens.append(end)
        last.append(len(ids) - 1)
    tables = [c.block_ids + [0] * (max_blocks - len(c.block_ids)) for c in chunks]

    def t(x, dtype):
        return torch.tensor(x, dtype=dtype, device=device)

    return ForwardBatch(
        input_ids=t(ids, torch.int64),
        positions=t(positions, torch.int64),
        slot_mapping=t(slots, torch.int64),
        block_tables=t(tables, torch.int32),
        seq_lens=t(slens, torch.int32),
        logits_indices=t(last, torch.int64),
        query_lens_list=qlens,
        seq_lens_list=slens,
        block_ids_list=[c.block_ids for c in chunks],
    )
