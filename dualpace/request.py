"""Request state: what a request asked for and what it has produced so far."""

from __future__ import annotations

from dataclasses import dataclass, field

from dualpace.sampling.params import SamplingParams
from dualpace.sampling.sampler import SamplingRow


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int  # the params' seed, or one drawn at admission
    max_tokens: int  # resolved: params.max_tokens capped by the model length
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "abort"

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def sampling_row(self) -> SamplingRow:
        p = self.params
        return SamplingRow(p.temperature, p.top_p, p.top_k, self.seed, len(self.output_ids))

    def stop_on_token(self, token: int, eos_ids: tuple[int, ...]) -> str | None:
        """Finish reason caused by the token just appended (stop strings are checked on text)."""
        if token in self.params.stop_token_ids:
            return "stop"
        if not self.params.ignore_eos and token in eos_ids:
            return "stop"
        if len(self.output_ids) >= self.max_tokens:
            return "length"
        return None


def find_stop_string(text: str, stops: tuple[str, ...], new_chars: int) -> int:
    """Index where the first stop string starts in ``text``, or -1.

    Only the region that the last ``new_chars`` characters could have completed is searched.
    """
    best = -1
    for s in stops:
        start = max(0, len(text) - new_chars - len(s) + 1)
        i = text.find(s, start)
        if i != -1 and (best == -1 or i < best):
            best = i
    return best
