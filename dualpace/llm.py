"""Offline Python API: ``LLM(model_dir, **options).generate(prompts, params)``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dualpace.config import EngineConfig
from dualpace.engine.inprocess import InProcessEngine
from dualpace.sampling.params import SamplingParams


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str


Prompt = str | Sequence[int]


class LLM:
    """Load a checkpoint and generate. Options are the ``dualpace serve`` flags, underscored."""

    def __init__(self, model: str, **options):
        self.config = EngineConfig.from_options(str(model), **options)
        self._engine: InProcessEngine | None = InProcessEngine(self.config)

    @property
    def tokenizer(self):
        return self._live().tokenizer

    def _live(self) -> InProcessEngine:
        if self._engine is None:
            raise RuntimeError("LLM was shut down")
        return self._engine

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self._live().tokenizer.encode(prompt)
        ids = list(prompt)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("prompt: a token-id prompt must be a list of integers")
        return ids

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """One output per prompt, in order. Prompts are strings or token-id lists."""
        engine = self._live()
        if isinstance(prompts, str) or (
            isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        params = params if params is not None else SamplingParams()
        plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"params: {len(plist)} sampling params for {len(prompts)} prompts")
        requests = [engine.make_request(self._prompt_ids(p), sp) for p, sp in zip(prompts, plist)]
        texts = engine.run(requests)
        return [
            RequestOutput(r.request_id, r.prompt_ids, r.output_ids, texts[r.request_id],
                          r.finish_reason)
            for r in requests
        ]

    def shutdown(self) -> None:
        self._engine = None

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
