"""The serving engine: the worker runtime plus the LLMEngine on top of it, with the
tokenizer and the limits resolved from the config. ``LLM`` and ``dualpace serve`` both
drive this one object (no in-process shortcut)."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from dualpace.config import EngineConfig
from dualpace.engine.llm_engine import EngineDead, LLMEngine
from dualpace.engine.outputs import RequestStream
from dualpace.engine.state import Limits
from dualpace.model.config import load_model_config
from dualpace.resolved import resolve
from dualpace.runtime.supervisor import Runtime
from dualpace.sampling.params import SamplingParams
from dualpace.tokenizer.tokenizer import Tokenizer

log = logging.getLogger("dualpace.engine")


class EngineUnavailable(RuntimeError):
    """Temporarily unable to take requests (workers restarting, or draining)."""


class ServingEngine:
    def __init__(self, config: EngineConfig, step_log: str | None = None):
        """``step_log``: a file that gets one JSON line per executed step (its work and
        seconds; what ``dualpace simulate`` fits its cost models to), stamped ``t``: the
        host's monotonic clock when the step was logged (the same clock in every process,
        so a benchmark can tell which of its runs a step belongs to); and one line per
        finished request (``kind`` "request": its arrival and token times on that clock)."""
        self.model_config = load_model_config(config.model)
        self.tokenizer = Tokenizer(config.model)
        # Resolved once: the runtime and the workers get this object.
        self.runtime = Runtime(resolve(config))
        self.engine: LLMEngine | None = None
        self._watch: asyncio.Task | None = None
        self.step_log = step_log
        self._step_file = None

    @property
    def config(self):
        """The resolved configuration; after ``start`` it also holds the GPU KV pool size a
        CUDA worker measured."""
        return self.runtime.config

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    async def start(self) -> None:
        rt, mc = self.runtime, self.model_config
        await rt.start()
        # Read after the start: a CUDA worker sizes the GPU pool and the runtime settles it
        # into a new config object. Read before (as until the first H200 run), the engine got
        # the 0 of "size it yourself", and on a GPU box every prompt went Prefill-to-CPU.
        cfg = self.config
        eos = mc.eos_token_ids or ((self.tokenizer.eos_token_id,)
                                   if self.tokenizer.eos_token_id is not None else ())
        limits = Limits(max_num_seqs=cfg.max_num_seqs, gpu_token_limit=cfg.max_num_batched_tokens,
                        cpu_batch_limit=cfg.cpu_batch_limit,
                        max_model_len=cfg.max_model_len, staging_blocks=cfg.staging_blocks)
        self.engine = LLMEngine(rt, gpu_blocks=cfg.gpu_kv_blocks, host_blocks=cfg.host_kv_blocks,
                                block_size=cfg.block_size, limits=limits,
                                policy=cfg.policy_object,
                                vocab_size=mc.vocab_size, eos_ids=eos, tokenizer=self.tokenizer,
                                async_scheduling=cfg.async_scheduling)
        rt.on_failure(lambda exc: self.engine.fail_all(str(exc)))
        if self.step_log:
            self._step_file = open(self.step_log, "a", buffering=1 << 16)  # noqa: SIM115
            self.engine.on_step = self.engine.on_request = self._log_step
        self.engine.start()
        self._watch = asyncio.create_task(self._watch_dead())

    async def _watch_dead(self) -> None:
        await self.runtime.dead.wait()
        self.engine.mark_dead(self.runtime.failure or "workers failed")

    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> RequestStream:
        """One sample (``params.n`` == 1)."""
        self._check_live()
        return self.engine.add_request(prompt_ids, params, self.max_model_len)

    def add_samples(self, prompt_ids: list[int], params: SamplingParams) -> list[RequestStream]:
        """``params.n`` samples of one prompt (one prefill; LLMEngine.add_samples)."""
        self._check_live()
        return self.engine.add_samples(prompt_ids, params, self.max_model_len)

    def _check_live(self) -> None:
        if self.engine is None or self.engine.dead:
            raise EngineDead(self.engine.dead if self.engine else "engine not started")
        if not self.runtime.available.is_set():
            raise EngineUnavailable("workers are restarting")

    def abort(self, rid: int) -> None:
        if self.engine is not None:
            self.engine.abort(rid)

    def abort_all(self) -> None:
        """Every live request finishes with "abort" (SIGTERM's drain timeout)."""
        if self.engine is not None:
            for rid in list(self.engine.requests):
                self.engine.abort(rid)

    def metrics(self) -> dict[str, float]:
        return self.engine.metrics.samples() if self.engine else {}

    def _log_step(self, record: dict) -> None:
        record = {**record, "t": round(time.monotonic(), 4)}
        self._step_file.write(json.dumps(record, separators=(",", ":")) + "\n")

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self.engine is not None:
            await self.engine.stop()
        await self.runtime.stop()
        if self._step_file is not None:
            self._step_file.close()
            self._step_file = None
