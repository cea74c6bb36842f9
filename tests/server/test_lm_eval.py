"""A real client: lm-eval-harness against a running `dualpace serve`, on tasks this test
writes (no hub access): a multiple-choice task through ``local-completions`` (loglikelihood:
echo + logprobs, token-id prompts) and a generate-until task through
``local-chat-completions``. The loglikelihoods the harness reports must equal transformers'
on the same checkpoint."""

from __future__ import annotations

import json
import os
import textwrap

# The tasks and the tokenizer are local files: never wait on the hub (CI has no network).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import lm_eval
import pytest
import torch
from lm_eval.tasks import TaskManager
from transformers import AutoModelForCausalLM, AutoTokenizer

MC_DOCS = [
    {"question": "The sky is", "choices": ["blue", "green", "loud"], "answer": 0},
    {"question": "Two plus two is", "choices": ["four", "five"], "answer": 0},
    {"question": "Cats like to", "choices": ["sleep", "fly", "swim", "code"], "answer": 0},
    {"question": "Water is", "choices": ["wet", "dry"], "answer": 0},
]
GEN_DOCS = [{"question": "Say hello.", "answer": "hello"},
            {"question": "Count to three.", "answer": "1 2 3"},
            {"question": "Name a color.", "answer": "red"}]


def _write_tasks(tmp_path):
    for name, docs in (("mc", MC_DOCS), ("gen", GEN_DOCS)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "dualpace_mc.yaml").write_text(textwrap.dedent(f"""\
        task: dualpace_mc
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {tmp_path / "mc.jsonl"}
        test_split: test
        output_type: multiple_choice
        doc_to_text: "{{{{question}}}}"
        doc_to_choice: "{{{{choices}}}}"
        doc_to_target: "{{{{answer}}}}"
        metric_list:
          - metric: acc
        """))
    (tmp_path / "dualpace_gen.yaml").write_text(textwrap.dedent(f"""\
        task: dualpace_gen
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {tmp_path / "gen.jsonl"}
        test_split: test
        output_type: generate_until
        doc_to_text: "{{{{question}}}}"
        doc_to_target: "{{{{answer}}}}"
        generation_kwargs:
          until: ["\\n\\n"]
          max_gen_toks: 8
          do_sample: false
          temperature: 0
        metric_list:
          - metric: exact_match
        """))
    return TaskManager(include_path=str(tmp_path))


def _hf_loglikelihood(hf, tok, context: str, continuation: str) -> float:
    ctx = tok.encode(context, add_special_tokens=False)
    cont = tok.encode(context + continuation, add_special_tokens=False)[len(ctx):]
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        lp = hf(ids).logits[0].float().log_softmax(-1)
    return sum(lp[len(ctx) - 1 + i, t].item() for i, t in enumerate(cont))


def test_lm_eval_harness_loglikelihood_and_generation(server, tiny_model, tmp_path):
    tm = _write_tasks(tmp_path)
    common = {"model": "tiny", "tokenizer": tiny_model, "tokenizer_backend": "huggingface",
              "num_concurrent": 2, "max_retries": 1}
    mc = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={**common, "base_url": server.url + "/v1/completions",
                    "tokenized_requests": True},
        tasks=["dualpace_mc"], task_manager=tm, log_samples=True)
    samples = mc["samples"]["dualpace_mc"]
    assert len(samples) == len(MC_DOCS) and "acc,none" in mc["results"]["dualpace_mc"]
    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model)
    checked = 0
    for s in samples:
        assert len(s["resps"]) == len(s["doc"]["choices"])
        for (context, continuation), resp in zip(s["arguments"], s["resps"]):
            ll, _greedy = resp[0]
            assert ll == pytest.approx(_hf_loglikelihood(hf, tok, context, continuation),
                                       abs=5e-3)
            checked += 1
    assert checked == sum(len(d["choices"]) for d in MC_DOCS)

    gen = lm_eval.simple_evaluate(
        model="local-chat-completions",
        model_args={**common, "base_url": server.url + "/v1/chat/completions"},
        tasks=["dualpace_gen"], task_manager=tm, apply_chat_template=True, log_samples=True)
    samples = gen["samples"]["dualpace_gen"]
    assert len(samples) == len(GEN_DOCS) and "exact_match,none" in gen["results"]["dualpace_gen"]
    assert all(isinstance(s["resps"][0][0], str) for s in samples)
