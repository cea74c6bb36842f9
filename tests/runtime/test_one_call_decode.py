"""A GPU worker's decode step on CPU as one native call, LM head included (issue 14).

The step's layers and its LM head run in the same C call (StagedModel.decode_logits), with
no Python between them in which the OpenMP team falls asleep; the tokens are those of the
two-call step (decode_layers, then post_layer), the prefill keeps the head apart.
"""

from __future__ import annotations

import pytest
import torch

from dualpace.model.native_stages import NativeStages
from dualpace.model.stages import StagedModel
from dualpace.runtime import protocol as P

from .test_async_copies import BS, EagerCopies, _worker, tiny_model  # noqa: F401 - fixture


def _count_calls(monkeypatch, *names: str) -> dict[str, int]:
    """Counts of the calls to these NativeStages methods from now on (they still run)."""
    calls = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(NativeStages, name)

        def spy(self, *a, _real=real, _name=name, **k):
            calls[_name] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(NativeStages, name, spy)
    return calls


def _run_steps(worker, prompt: list[int], steps: int) -> list[int]:
    """Prefill ``prompt`` as request 1, then ``steps`` greedy decode steps; the tokens."""
    worker.requests.add(P.NewRequest(req_id=1, sampling=P.SamplingSpec(
        temperature=0.0, top_p=1.0, top_k=-1, seed=0)))
    blocks = list(range(-(-(len(prompt) + steps) // BS)))
    n0 = -(-len(prompt) // BS)
    out = worker.run(P.GpuBatch(1, [P.SeqStep(1, prompt, 0, new_blocks=blocks[:n0])], [],
                                [])).tokens
    sent = n0
    for s in range(steps - 1):
        pos = len(prompt) + s
        need = -(-(pos + 1) // BS)
        seq = P.SeqStep(1, [out[-1]], pos, new_blocks=blocks[sent:need], out_index=len(out))
        sent = max(sent, need)
        out += worker.run(P.GpuBatch(2 + s, [seq], [], [])).tokens
    return out


def test_decode_steps_run_layers_and_head_in_one_call(tiny_model, monkeypatch):  # noqa: F811
    if tiny_model.native is None:
        pytest.skip(f"no native stages here: {tiny_model.why_native}")
    calls = _count_calls(monkeypatch, "decode_logits", "final")
    prompt, steps = [3, 9, 4, 17, 2, 8], 6
    got = _run_steps(_worker(tiny_model, EagerCopies()), prompt, steps)
    # the prefill's head apart (final), each decode step's in the layers' call
    assert calls == {"decode_logits": steps - 1, "final": 1}
    monkeypatch.setattr(StagedModel, "decode_logits", lambda *a, **k: None)
    want = _run_steps(_worker(tiny_model, EagerCopies()), prompt, steps)
    assert calls["final"] == 1 + steps
    assert got == want and len(got) == steps
    assert torch.tensor(got).lt(tiny_model.cfg.vocab_size).all()


def _cpu_tokens(model, rows: list[int], steps: int) -> list[list[int]]:
    """A CPU worker (Full-CPU route, no assist channel) decoding ``steps`` greedy steps of
    one request per entry of ``rows`` (its context length before the first), over host KV
    filled with seeded noise; the tokens per step."""
    from dualpace.runtime.cpu_worker import CpuWorker, HostKV

    c = model.cfg
    per = -(-(max(rows) + steps) // BS)
    g = torch.Generator().manual_seed(5)
    shape = (per * len(rows), c.num_kv_heads, BS, c.head_dim)
    k = [torch.randn(shape, generator=g) for _ in range(c.num_layers)]
    v = [torch.randn(shape, generator=g) for _ in range(c.num_layers)]
    worker = CpuWorker(model, HostKV(k, v, BS), [], (1, 1), lambda: True)
    tokens = [7 + i for i in range(len(rows))]
    for i in range(len(rows)):
        worker.requests.add(P.NewRequest(req_id=i + 1, sampling=P.SamplingSpec(
            temperature=0.0, top_p=1.0, top_k=-1, seed=0)))
    out = []
    for s in range(steps):
        seqs = [P.SeqStep(i + 1, [tokens[i]], n + s,
                          new_blocks=list(range(i * per, (i + 1) * per)) if s == 0 else [],
                          out_index=s)
                for i, n in enumerate(rows)]
        tokens = worker.run(P.CpuBatch(s + 1, seqs)).tokens
        out.append(tokens)
    assert worker.routes["full-cpu"] == steps
    return out


def test_cpu_worker_full_cpu_steps_run_layers_and_head_in_one_call(tiny_model, monkeypatch):  # noqa: F811
    if tiny_model.native is None:
        pytest.skip(f"no native stages here: {tiny_model.why_native}")
    calls = _count_calls(monkeypatch, "decode_logits", "final")
    got = _cpu_tokens(tiny_model, [5, 19, 2], 4)
    assert calls == {"decode_logits": 4, "final": 0}
    monkeypatch.setattr(StagedModel, "decode_logits", lambda *a, **k: None)
    assert _cpu_tokens(tiny_model, [5, 19, 2], 4) == got
    assert calls["final"] == 4
