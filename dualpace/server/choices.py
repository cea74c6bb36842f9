"""The ``choices`` entries of completions and chat responses, whole or as stream chunks.

A ``Piece`` is what a choice shows at once: the text, token ids and logprobs of one engine
delta in a stream (empty text while the detokenizer holds a partial character back), or of
all of them in a whole response, and with the first the prompt's logprobs.
The builders add what the request asked for: logprobs, echo, return_token_ids,
prompt_logprobs (vLLM's shapes, named in each builder's docstring).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dualpace.engine.outputs import CompletionDelta
from dualpace.server.logprobs_format import (
    CompletionLogprobs,
    TokenText,
    chat_logprobs,
    prompt_logprobs_field,
)


@dataclass
class Piece:
    text: str = ""
    reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    prompt_logprobs: list | None = None

    def add(self, d: CompletionDelta) -> None:
        self.text += d.text
        self.token_ids += d.token_ids
        self.logprobs += d.logprobs
        if d.prompt_logprobs is not None:
            self.prompt_logprobs = d.prompt_logprobs
        if d.finished:
            self.reason = d.finish_reason


class CompletionChoices:
    """``{"index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_logprobs"}``
    (+ ``token_ids``, and ``prompt_token_ids`` in the first, with return_token_ids). With
    echo the first piece starts with the prompt's text and, with logprobs, its tokens (the
    first with a null logprob, as it has no context). Choice ``i`` is sample ``i % n`` of
    prompt ``i // n`` (vLLM's order)."""

    def __init__(self, prompts: list[list[int]], prompt_texts: list[str | None], params,
                 text: TokenText, *, echo: bool, token_ids: bool, want_prompt_lps: bool):
        self.prompts, self.prompt_texts, self.params = prompts, prompt_texts, params
        self.text, self.echo, self.ids, self.want_plps = text, echo, token_ids, want_prompt_lps
        self.lp = [CompletionLogprobs(text) for _ in range(len(prompts) * params.n)]

    def build(self, i: int, p: Piece, first: bool) -> dict:
        text = p.text
        lps = None
        prompt = self.prompts[i // self.params.n]
        if self.params.logprobs is not None:
            lps = self.lp[i].empty()
            if self.echo and first:
                self.lp[i].extend(lps, self.lp[i].prompt(prompt, p.prompt_logprobs))
            self.lp[i].extend(lps, self.lp[i].chunk(p.token_ids, p.logprobs))
        if self.echo and first:
            given = self.prompt_texts[i // self.params.n]
            text = (given if given is not None else self.text.tokenizer.decode(
                prompt, skip_special_tokens=False)) + text
        c = {"index": i, "text": text, "logprobs": lps, "finish_reason": p.reason,
             "stop_reason": None,
             "prompt_logprobs": (prompt_logprobs_field(self.text, prompt, p.prompt_logprobs)
                                 if self.want_plps and first else None)}
        if self.ids:
            c["token_ids"] = p.token_ids
            if first:
                c["prompt_token_ids"] = prompt
        return c


class ChatChoices:
    """``{"index", "delta" | "message", "logprobs", "finish_reason"}`` (+ ``token_ids``);
    the prompt's ids and logprobs go beside the choices (``extra``)."""

    def __init__(self, prompt: list[int], params, text: TokenText, *, token_ids: bool,
                 want_prompt_lps: bool):
        self.prompt, self.params, self.text = prompt, params, text
        self.ids, self.want_plps = token_ids, want_prompt_lps

    def _logprobs(self, p: Piece):
        if self.params.logprobs is None:
            return None
        return chat_logprobs(self.text, p.token_ids, p.logprobs)

    def chunk(self, i: int, p: Piece, first: bool) -> dict:
        d = {"role": "assistant", "content": p.text} if first else {"content": p.text}
        c = {"index": i, "delta": d, "logprobs": self._logprobs(p), "finish_reason": p.reason}
        if self.ids:
            c["token_ids"] = p.token_ids
        return c

    def message(self, i: int, p: Piece) -> dict:
        c = {"index": i, "message": {"role": "assistant", "content": p.text},
             "logprobs": self._logprobs(p), "finish_reason": p.reason, "stop_reason": None}
        if self.ids:
            c["token_ids"] = p.token_ids
        return c

    def extra(self, p: Piece, whole: bool) -> dict:
        """Beside the choices of the response, or of the first chunk."""
        out = {"prompt_token_ids": self.prompt} if self.ids else {}
        if self.want_plps:
            out["prompt_logprobs"] = prompt_logprobs_field(self.text, self.prompt,
                                                           p.prompt_logprobs)
        elif whole:
            out["prompt_logprobs"] = None
        return out
