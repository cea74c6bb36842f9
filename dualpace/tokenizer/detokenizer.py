"""Incremental detokenization for streaming (vLLM's prefix/read-offset method).

Text is emitted only when the decoded window does not end in U+FFFD, i.e. never in the middle
of a multi-byte UTF-8 character; ``flush`` releases what is held back when the request ends.
The concatenation of all emitted pieces equals decoding every output token at once.
"""

from __future__ import annotations

from dualpace.tokenizer.tokenizer import Tokenizer

# Tokens of the prompt's tail used as decoding context: leading-space rules of some decoders
# (Metaspace) depend on what precedes a token.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int] | None = None):
        self._tok = tokenizer
        self._ids: list[int] = list((prompt_ids or [])[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._context_len = len(self._ids)
        self.text = ""

    def _window(self, start: int, end: int) -> str:
        return self._tok.decode(self._ids[start:end])

    def add(self, token_id: int) -> str:
        """Append one token; returns the newly complete text (possibly empty)."""
        self._ids.append(token_id)
        prefix = self._window(self._prefix_offset, self._read_offset)
        full = self._window(self._prefix_offset, len(self._ids))
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix):]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """At the end of the request: whatever was held back (e.g. an incomplete sequence)."""
        prefix = self._window(self._prefix_offset, self._read_offset)
        full = self._window(self._prefix_offset, len(self._ids))
        delta = full[len(prefix):]
        self._prefix_offset = self._read_offset = len(self._ids)
        self.text += delta
        return delta
