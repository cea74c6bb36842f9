"""Per-request output streams: detokenization, stop strings, and what clients receive.

Runs in the engine's completion loop, off the engine loops' critical path. Text deltas never
end inside a UTF-8 character (IncrementalDetokenizer) and hold back len(stop) - 1 characters
while stop strings are set, so a stop string is never emitted (DESIGN.md §Front end).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from dualpace.sampling.params import SamplingParams
from dualpace.tokenizer.detokenizer import IncrementalDetokenizer


@dataclass
class TokenEvent:
    """From an engine loop: new tokens of a request, and whether it finished."""

    rid: int
    tokens: list[int]
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list = field(default_factory=list)  # per token: the worker's logprobs or None
    prompt_logprobs: list | None = None  # with the first token, when asked for


@dataclass
class CompletionDelta:
    """What a request's consumer receives: new text and token ids since the last delta."""

    text: str
    token_ids: list[int]
    logprobs: list = field(default_factory=list)  # aligned with token_ids (None: not asked)
    prompt_logprobs: list | None = None  # prompt tokens 1.. (first delta only, when asked)
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0


def find_stop_string(text: str, stops: tuple[str, ...], start: int) -> int:
    """Index of the earliest stop string in ``text`` that ends after ``start``, or -1."""
    best = -1
    for s in stops:
        i = text.find(s, max(0, start - len(s) + 1))
        if i != -1 and (best == -1 or i < best):
            best = i
    return best


@dataclass(eq=False)
class RequestStream:
    rid: int
    params: SamplingParams
    detok: IncrementalDetokenizer | None
    num_prompt_tokens: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    emitted: int = 0  # characters of detok.text already sent
    num_output_tokens: int = 0
    last_reason: str | None = None  # the consumer's record of the finish reason
    closed: bool = False  # the final delta was produced
    done: bool = False  # the consumer received it
    sample_index: int = 0  # which of the prompt's n samples (parallel sampling)

    def __aiter__(self):
        return self

    async def __anext__(self) -> CompletionDelta:
        if self.done and self.queue.empty():
            raise StopAsyncIteration
        delta = await self.queue.get()
        if delta.finished:
            self.done = True
        return delta

    def process(self, ev: TokenEvent) -> tuple[CompletionDelta | None, bool]:
        """Apply an engine event; returns (delta to send or None, stop string hit)."""
        if self.closed:
            return None, False
        self.num_output_tokens += len(ev.tokens)
        finished = ev.finish_reason is not None
        reason, hit = ev.finish_reason, False
        text = ""
        if self.detok is not None:
            before = len(self.detok.text)
            for t in ev.tokens:
                self.detok.add(t)
            if finished:
                self.detok.flush()
            full = self.detok.text
            # Stop strings, like stop tokens, wait for min_tokens outputs (vLLM).
            if (self.params.stop and ev.error is None
                    and self.num_output_tokens >= self.params.min_tokens):
                at = find_stop_string(full, self.params.stop, before)
                if at != -1:
                    full = self.detok.text = full[:at]
                    finished, reason, hit = True, "stop", True
            hold = 0 if finished or not self.params.stop else max(map(len, self.params.stop)) - 1
            visible = len(full) - hold
            if visible > self.emitted:
                text = full[self.emitted:visible]
                self.emitted = visible
        if not text and not ev.tokens and not finished:
            return None, False
        if finished:
            self.closed = True
        lps = ev.logprobs if len(ev.logprobs) == len(ev.tokens) else [None] * len(ev.tokens)
        return CompletionDelta(text=text, token_ids=list(ev.tokens), logprobs=list(lps),
                               prompt_logprobs=ev.prompt_logprobs, finished=finished,
                               finish_reason=reason, error=ev.error,
                               num_prompt_tokens=self.num_prompt_tokens,
                               num_output_tokens=self.num_output_tokens), hit
