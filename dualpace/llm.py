"""Offline Python API: ``LLM(model_dir, **options).generate(prompts, params)``.

It drives the same engine and worker processes as ``dualpace serve``: an asyncio loop in a
background thread runs the ServingEngine; ``generate`` blocks until every output is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from dualpace.config import EngineConfig
from dualpace.engine.serving import ServingEngine
from dualpace.sampling.params import SamplingParams


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    error: str | None = None


Prompt = str | Sequence[int]


class LLM:
    """Load a checkpoint, start the workers, generate. Options are the ``dualpace serve``
    flags with underscores (``--gpu-kv-blocks`` -> ``gpu_kv_blocks``)."""

    def __init__(self, model: str, **options):
        self.config = EngineConfig.from_options(str(model), **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dualpace-llm",
                                        daemon=True)
        self._thread.start()
        self._serving: ServingEngine | None = None
        try:
            self._serving = self._run(self._start())
        except BaseException:
            self._close_loop()
            raise

    async def _start(self) -> ServingEngine:
        serving = ServingEngine(self.config)
        try:
            await serving.start()
        except BaseException:
            await serving.runtime.stop()
            raise
        return serving

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _live(self) -> ServingEngine:
        if self._serving is None:
            raise RuntimeError("LLM was shut down")
        return self._serving

    @property
    def tokenizer(self):
        return self._live().tokenizer

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
        """One output per prompt, in order; with ``n`` > 1 samples, ``n`` consecutive
        outputs per prompt (one prefill each prompt). Prompts are strings or token-id
        lists."""
        serving = self._live()
        if isinstance(prompts, str) or (
            isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        params = params if params is not None else SamplingParams()
        plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"params: {len(plist)} sampling params for {len(prompts)} prompts")
        ids = [self._prompt_ids(p) for p in prompts]
        return self._run(self._generate(serving, ids, plist))

    @staticmethod
    async def _generate(serving: ServingEngine, ids, plist) -> list[RequestOutput]:
        streams, prompts = [], []
        try:
            for p, sp in zip(ids, plist):
                streams += serving.add_samples(p, sp)
                prompts += [p] * sp.n
        except BaseException:
            for s in streams:
                serving.abort(s.rid)
            raise

        async def collect(prompt, stream) -> RequestOutput:
            toks, text, reason, error = [], [], "abort", None
            async for d in stream:
                toks += d.token_ids
                text.append(d.text)
                if d.finished:
                    reason, error = d.finish_reason, d.error
            return RequestOutput(f"req-{stream.rid}", prompt, toks, "".join(text), reason, error)

        return list(await asyncio.gather(*(collect(p, s) for p, s in zip(prompts, streams))))

    def metrics(self) -> dict[str, float]:
        """The samples ``/metrics`` exposes, keyed by Prometheus sample name with labels."""
        serving = self._live()

        async def read():
            return serving.metrics()

        return self._run(read())

    def shutdown(self) -> None:
        if self._serving is not None:
            serving, self._serving = self._serving, None
            self._run(serving.stop())
        self._close_loop()

    def _close_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_closed() and not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __del__(self, _suppress=contextlib.suppress):
        # best effort only; at interpreter exit the module's globals may already be None,
        # so suppress is bound here, when the class is defined
        with _suppress(Exception):
            self.shutdown()
