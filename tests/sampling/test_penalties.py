"""Penalties, logit bias and min_tokens against a plain-Python reference of their
definitions (sampling/penalties.py quotes them), case by case and combined."""

from __future__ import annotations

import math
import random

import pytest
import torch

from dualpace.sampling.penalties import Penalties, apply_penalties
from dualpace.sampling.sampler import SamplingRow, sample

V = 12


def _row(p: Penalties | None, outputs=(), temperature=0.0) -> SamplingRow:
    return SamplingRow(temperature, 1.0, -1, 0, len(outputs), -1, p, tuple(outputs))


def reference(logits: list[float], p: Penalties, outputs: list[int]) -> list[float]:
    x = list(logits)
    if len(outputs) < p.min_tokens:
        for t in p.stop_ids:
            x[t] = -math.inf
    for t, b in p.bias:
        x[t] += b
    if p.repetition != 1.0:
        for t in set(p.prompt) | set(outputs):
            x[t] = x[t] / p.repetition if x[t] > 0 else x[t] * p.repetition
    for t in set(outputs):
        x[t] -= p.frequency * outputs.count(t) + p.presence
    return x


CASES = [
    Penalties(presence=0.7),
    Penalties(frequency=0.4),
    Penalties(presence=-0.5, frequency=-1.0),
    Penalties(repetition=1.3, prompt=(1, 2, 3)),
    Penalties(repetition=0.8, prompt=(5,)),
    Penalties(bias=((0, 5.0), (7, -100.0))),
    Penalties(min_tokens=4, stop_ids=(2, 9)),
    Penalties(presence=0.2, frequency=0.3, repetition=1.2, min_tokens=2, stop_ids=(11,),
              bias=((4, 1.5),), prompt=(4, 4, 6)),
]


@pytest.mark.parametrize("p", CASES)
@pytest.mark.parametrize("outputs", [[], [3], [3, 3, 8, 1], [0, 2, 2, 9, 9, 9]])
def test_matches_the_definitions(p, outputs):
    g = torch.Generator().manual_seed(len(outputs) * 31 + CASES.index(p))
    logits = torch.randn(1, V, generator=g) * 3
    got = apply_penalties(logits, [_row(p, outputs)])[0].tolist()
    want = reference(logits[0].tolist(), p, outputs)
    assert got == pytest.approx(want, rel=1e-6, abs=1e-6)


def test_rows_without_penalties_are_untouched_and_greedy_follows_the_penalties():
    logits = torch.tensor([[5.0, 4.0, 0.0, -1.0], [5.0, 4.0, 0.0, -1.0]])
    rows = [_row(None, [0, 0]), _row(Penalties(frequency=1.0), [0, 0])]
    out = apply_penalties(logits, rows)
    assert out[0].tolist() == logits[0].tolist()
    assert out[1].tolist() == [3.0, 4.0, 0.0, -1.0]  # 5 - 1.0 * 2
    assert sample(logits, rows) == [0, 1]
    # min_tokens holds EOS back, then releases it
    eos = Penalties(min_tokens=2, stop_ids=(0,))
    assert sample(logits[:1], [_row(eos, [1])]) == [1]
    assert sample(logits[:1], [_row(eos, [1, 1])]) == [0]


def test_random_batches_against_the_reference():
    rng = random.Random(5)
    for _ in range(20):
        rows, refs = [], []
        logits = torch.tensor([[rng.uniform(-4, 4) for _ in range(V)] for _ in range(6)])
        for i in range(6):
            p = None if rng.random() < 0.3 else Penalties(
                presence=rng.uniform(-2, 2), frequency=rng.uniform(-2, 2),
                repetition=rng.uniform(0.5, 1.8), min_tokens=rng.randrange(4),
                stop_ids=(rng.randrange(V),), bias=((rng.randrange(V), rng.uniform(-9, 9)),),
                prompt=tuple(rng.randrange(V) for _ in range(5)))
            outs = [rng.randrange(V) for _ in range(rng.randrange(6))]
            rows.append(_row(p, outs))
            refs.append(logits[i].tolist() if p is None else reference(logits[i].tolist(),
                                                                        p, outs))
        got = apply_penalties(logits, rows)
        for i in range(6):
            assert got[i].tolist() == pytest.approx(refs[i], rel=1e-5, abs=1e-5)
