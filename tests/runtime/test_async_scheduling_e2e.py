"""Async scheduling through the real runtime (the GPU worker on CPU cores): decode steps
submitted ahead of their predecessor's result give exactly the tokens of plan -> execute ->
apply, greedy and seeded, through stop tokens (whose step ahead is dropped) and lengths."""

from __future__ import annotations

from dualpace import LLM, SamplingParams


def _run(checkpoint, async_scheduling: bool, stop_token: int | None = None):
    with LLM(str(checkpoint), gpu_device="cpu", max_model_len=256, gpu_kv_blocks=64,
             async_scheduling=async_scheduling) as llm:
        params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
                  SamplingParams(temperature=1.0, seed=5, max_tokens=25, ignore_eos=True),
                  SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                 stop_token_ids=[] if stop_token is None else [stop_token])]
        outs = llm.generate(["hello there", "abc", "hello there"], params)
        return [(o.token_ids, o.finish_reason) for o in outs], llm.metrics()


def test_the_same_tokens_with_steps_ahead(llama_checkpoint):
    ckpt = llama_checkpoint[0]
    plain, m_plain = _run(ckpt, False)
    stop = plain[0][0][12]  # the third request stops where this token first comes
    plain, m_plain = _run(ckpt, False, stop)
    ahead, m_ahead = _run(ckpt, True, stop)
    assert ahead == plain
    first = plain[0][0].index(stop)
    assert plain[2] == (plain[0][0][:first + 1], "stop")
    assert [len(t) for t, _ in plain[:2]] == [40, 25]
    assert m_plain.get("dualpace:async_scheduled_steps_total", 0) == 0
    assert m_ahead["dualpace:async_scheduled_steps_total"] >= 10
