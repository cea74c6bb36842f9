"""The offline ``LLM`` API: prompts, stopping, seeds, limits and errors."""

from __future__ import annotations

import pytest

from dualpace import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(llama_checkpoint):
    with LLM(str(llama_checkpoint[0]), gpu_device="cpu", max_model_len=256,
             gpu_kv_blocks=64) as llm:
        yield llm


def test_string_and_token_prompts_agree(llm):
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    by_text = llm.generate("hello", greedy)[0]
    by_ids = llm.generate([llm.tokenizer.encode("hello")], greedy)[0]
    assert by_text.token_ids == by_ids.token_ids and len(by_text.token_ids) == 8
    assert by_text.text == llm.tokenizer.decode(by_text.token_ids)


def test_seeded_sampling_reproducible_and_batch_independent(llm):
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    alone = llm.generate(["abc"], p)[0].token_ids
    again = llm.generate(["abc"], p)[0].token_ids
    others = [SamplingParams(temperature=1.0, seed=s, max_tokens=30, ignore_eos=True)
              for s in range(3)]
    batch = llm.generate(["zz", "abc", "a much longer prompt than the others"],
                         [others[0], p, others[1]])
    assert alone == again == batch[1].token_ids
    other_seed = llm.generate(["abc"], SamplingParams(temperature=1.0, top_p=0.9, seed=99,
                                                     max_tokens=16, ignore_eos=True))
    assert other_seed[0].token_ids != alone


def test_n_samples_are_consecutive_outputs(llm):
    """n > 1: n outputs per prompt, in prompt order; sample j is the lone request with
    seed + j (one prefill per prompt, its KV forked into the others)."""
    p = SamplingParams(n=3, temperature=1.0, seed=77, max_tokens=10, ignore_eos=True)
    outs = llm.generate(["abc", "a second prompt"], p)
    assert len(outs) == 6
    assert [o.prompt_token_ids for o in outs] == (
        [llm.tokenizer.encode("abc")] * 3 + [llm.tokenizer.encode("a second prompt")] * 3)
    for j in range(3):
        lone = llm.generate("abc", SamplingParams(temperature=1.0, seed=77 + j, max_tokens=10,
                                                  ignore_eos=True))[0]
        assert outs[j].token_ids == lone.token_ids
    assert len({tuple(o.token_ids) for o in outs[:3]}) > 1


def test_stop_token_ids_and_eos(llm):
    ref = llm.generate("x", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    target = ref.token_ids[5]
    first = ref.token_ids.index(target)
    out = llm.generate("x", SamplingParams(temperature=0, max_tokens=20,
                                           stop_token_ids=[target]))[0]
    assert out.finish_reason == "stop" and out.token_ids == ref.token_ids[: first + 1]


def test_stop_string_truncates_text(llm):
    ref = llm.generate("q", SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0]
    text = ref.text
    stop = next((text[i:i + 2] for i in range(4, len(text) - 2)
                 if "\ufffd" not in text[i:i + 2]), None)
    if stop is None:
        pytest.fail(f"no usable stop string in {text!r}")
    out = llm.generate("q", SamplingParams(temperature=0, max_tokens=24, stop=[stop],
                                           ignore_eos=True))[0]
    assert out.finish_reason == "stop"
    assert out.text == text[: text.index(stop)]


def test_limits_and_bad_prompts(llm):
    with pytest.raises(ValueError, match="maximum context length is 256 tokens"):
        llm.generate([[1] * 200], SamplingParams(max_tokens=100))
    with pytest.raises(ValueError, match="prompt"):
        llm.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="out of vocabulary"):
        llm.generate([[1, 99999]], SamplingParams())
    with pytest.raises(ValueError, match="params"):
        llm.generate(["a", "b"], [SamplingParams()])
    out = llm.generate([[1] * 250], SamplingParams(max_tokens=None, temperature=0,
                                                   ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 6


def test_unknown_option_is_rejected(llama_checkpoint):
    with pytest.raises(TypeError, match="gpu_kv_blokcs"):
        LLM(str(llama_checkpoint[0]), gpu_kv_blokcs=3)
    with pytest.raises(ValueError, match="block_size"):
        LLM(str(llama_checkpoint[0]), block_size=12)


def test_context_manager_shuts_down(llama_checkpoint):
    with LLM(str(llama_checkpoint[0]), gpu_device="cpu", gpu_kv_blocks=16) as llm:
        llm.generate("a", SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate("a", SamplingParams(max_tokens=2))


def test_the_engine_takes_the_gpu_pool_the_runtime_settled(llama_checkpoint, monkeypatch):
    """A CUDA worker sizes the GPU pool itself and the runtime settles that size into a new
    config at start. On the first H200 run the engine had read the config before the start:
    its GPU pool held 0 blocks and every prompt went Prefill-to-CPU. Here the start settles
    a size other than the configured one, as a CUDA worker's measurement would, and the
    engine's pool must be that size (fewer blocks than the worker holds: safe on CPU)."""
    import msgspec

    from dualpace.runtime.supervisor import Runtime

    real_start = Runtime.start

    async def start_and_settle(self):
        await real_start(self)
        self.config = msgspec.structs.replace(self.config,
                                              gpu_kv_blocks=self.config.gpu_kv_blocks - 3)

    monkeypatch.setattr(Runtime, "start", start_and_settle)
    with LLM(str(llama_checkpoint[0]), gpu_device="cpu", max_model_len=256,
             gpu_kv_blocks=40, policy="gpu-only") as llm:
        assert llm._serving.engine.state.gpu_pool.num_blocks == 37
        out = llm.generate(["hello"], SamplingParams(temperature=0, max_tokens=4,
                                                     ignore_eos=True))
        assert len(out[0].token_ids) == 4


def test_an_engine_without_a_gpu_pool_is_refused():
    from dualpace.engine.llm_engine import LLMEngine
    from dualpace.engine.state import Limits

    limits = Limits(max_num_seqs=4, gpu_token_limit=64, cpu_batch_limit=4, max_model_len=64,
                    staging_blocks=8)
    with pytest.raises(ValueError, match="0 GPU"):
        LLMEngine(None, gpu_blocks=0, host_blocks=8, block_size=4, limits=limits,
                  policy="dualpace", vocab_size=10, eos_ids=())


def test_a_collected_llm_says_nothing_at_interpreter_exit():
    """``__del__`` of an LLM collected while the interpreter tears its modules down (their
    globals set to None, as at exit) stays silent: it once printed "'NoneType' object has
    no attribute 'suppress'" after a script whose LLM outlived its ``with`` block."""
    import subprocess
    import sys

    script = ("import dualpace.llm as m\n"
              "x = m.LLM.__new__(m.LLM)\n"  # half-built: shutdown() raises inside __del__
              "for name in list(vars(m)):\n"
              "    if not name.startswith('__'):\n"
              "        setattr(m, name, None)\n"
              "del x\n"
              "print('done')\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr
    assert proc.stderr == "", proc.stderr
