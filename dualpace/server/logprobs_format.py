"""Logprobs in OpenAI's two response shapes (vLLM's field names).

Completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, where each
``top_logprobs`` entry maps token text to logprob for the k most likely tokens and the
sampled one (so up to k + 1 entries, as vLLM returns them). Chat: ``{"content": [{"token",
"logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`` with exactly the k
most likely tokens. A token's text is its own decoding, special tokens included, or
``"token_id:<id>"`` with vLLM's ``return_tokens_as_token_ids`` (then tokens whose decodings
coincide, such as partial UTF-8 bytes, stay apart in the completions dict).
"""

from __future__ import annotations


class TokenText:
    def __init__(self, tokenizer, as_ids: bool = False):
        self.tokenizer, self.as_ids = tokenizer, as_ids

    def __call__(self, token_id: int) -> str:
        if self.as_ids:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


class CompletionLogprobs:
    """One choice's completions-style logprobs, built across stream chunks (the text offset
    runs on)."""

    def __init__(self, text: TokenText, offset: int = 0):
        self.text, self.offset = text, offset

    @staticmethod
    def empty() -> dict:
        return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

    @staticmethod
    def extend(into: dict, more: dict) -> None:
        for k, v in more.items():
            into[k] += v

    def prompt(self, prompt_ids: list[int], plps: list | None) -> dict:
        """The echoed prompt's entries: the first token has no logprob (no context)."""
        lps = [None, *(plps or [])]
        lps += [None] * (len(prompt_ids) - len(lps))
        return self.chunk(prompt_ids, lps)

    def chunk(self, token_ids: list[int], lps: list) -> dict:
        out = self.empty()
        for t, lp in zip(token_ids, lps):
            s = self.text(t)
            out["tokens"].append(s)
            out["text_offset"].append(self.offset)
            self.offset += len(s)
            if lp is None:  # the echoed prompt's first token
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
                continue
            out["token_logprobs"].append(lp.logprob)
            top = {self.text(i): v for i, v in zip(lp.top_ids, lp.top_logprobs)}
            top.setdefault(s, lp.logprob)
            out["top_logprobs"].append(top)
        return out


def chat_logprobs(text: TokenText, token_ids: list[int], lps: list) -> dict:
    def entry(t: int, v: float) -> dict:
        s = text(t)
        return {"token": s, "logprob": v, "bytes": list(s.encode("utf-8"))}

    content = []
    for t, lp in zip(token_ids, lps):
        if lp is None:
            continue
        e = entry(t, lp.logprob)
        e["top_logprobs"] = [entry(i, v) for i, v in zip(lp.top_ids, lp.top_logprobs)]
        content.append(e)
    return {"content": content}


def prompt_logprobs_field(text: TokenText, prompt_ids: list[int], plps: list | None) -> list:
    """vLLM's ``prompt_logprobs``: per prompt token, null for the first, else {token id:
    {"logprob", "rank", "decoded_token"}} for the actual token and the top k."""
    out: list = [None]
    for t, lp in zip(prompt_ids[1:], plps or []):
        entry = {str(i): {"logprob": v, "rank": r + 1, "decoded_token": text(i)}
                 for r, (i, v) in enumerate(zip(lp.top_ids, lp.top_logprobs))}
        entry.setdefault(str(t), {"logprob": lp.logprob, "rank": lp.rank,
                                  "decoded_token": text(t)})
        out.append(entry)
    return out
