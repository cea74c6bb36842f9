"""Per-request sampling parameters, with vLLM's field names and validation."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs (sampling/logprobs.py computes them)
MAX_N = 128  # samples per prompt (OpenAI's limit; each is a request of its own)


def _check(cond: bool, name: str, message: str) -> None:
    if not cond:
        raise ValueError(f"{name}: {message}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop.

    temperature 0 means greedy. top_k <= 0 (vLLM uses -1) and top_p 1 disable the filters.
    A ``seed`` makes the request's tokens reproducible and independent of what else shares
    its batch. ``max_tokens=None`` means "up to the model length".
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    max_tokens: int | None = 16
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    logprobs: int | None = None  # k: each sampled token's logprob and the top k alternatives
    prompt_logprobs: int | None = None  # k: each prompt token's (after the first) and top k
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0  # stop tokens (EOS, stop_token_ids) are masked until this many
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias); a dict is accepted

    def __post_init__(self):
        # Accept lists / a single string for stop and stop_token_ids, store tuples (hashable).
        stop = self.stop
        if stop is None:
            stop = ()
        elif isinstance(stop, str):
            stop = (stop,)
        _check(isinstance(stop, (list, tuple)), "stop", "must be a string or a list of strings")
        _check(all(isinstance(s, str) for s in stop), "stop", "every entry must be a string")
        _check(all(len(s) > 0 for s in stop), "stop", "stop strings must not be empty")
        object.__setattr__(self, "stop", tuple(stop))
        ids = self.stop_token_ids if self.stop_token_ids is not None else ()
        _check(isinstance(ids, (list, tuple)), "stop_token_ids", "must be a list of integers")
        _check(all(_is_int(i) and i >= 0 for i in ids), "stop_token_ids",
               "every entry must be a non-negative integer")
        object.__setattr__(self, "stop_token_ids", tuple(ids))

        _check(_is_int(self.n) and 1 <= self.n <= MAX_N, "n",
               f"must be an integer in [1, {MAX_N}], got {self.n!r}")
        _check(_is_num(self.temperature) and 0.0 <= self.temperature <= 100.0, "temperature",
               f"must be a number in [0, 100], got {self.temperature!r}")
        _check(_is_num(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p",
               f"must be in (0, 1], got {self.top_p!r}")
        _check(_is_int(self.top_k) and (self.top_k == -1 or self.top_k >= 0), "top_k",
               f"must be -1 (disabled), 0 (disabled) or a positive integer, got {self.top_k!r}")
        _check(self.seed is None or (_is_int(self.seed) and -(2**63) <= self.seed < 2**63),
               "seed", f"must be a 64-bit signed integer, got {self.seed!r}")
        _check(self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
               "max_tokens", f"must be a positive integer, got {self.max_tokens!r}")
        _check(isinstance(self.ignore_eos, bool), "ignore_eos", "must be a boolean")
        _check(self.logprobs is None or (_is_int(self.logprobs) and self.logprobs >= 0),
               "logprobs", f"must be a non-negative integer, got {self.logprobs!r}")
        _check(self.logprobs is None or self.logprobs <= MAX_LOGPROBS, "logprobs",
               f"Requested sample logprobs of {self.logprobs}, which is greater than max "
               f"allowed: {MAX_LOGPROBS}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            _check(_is_num(v) and -2.0 <= v <= 2.0, name, f"must be in [-2, 2], got {v!r}")
        _check(_is_num(self.repetition_penalty) and self.repetition_penalty > 0.0,
               "repetition_penalty", f"must be greater than zero, got "
               f"{self.repetition_penalty!r}")
        _check(_is_int(self.min_tokens) and self.min_tokens >= 0, "min_tokens",
               f"must be a non-negative integer, got {self.min_tokens!r}")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               f"min_tokens ({self.min_tokens}) must not exceed max_tokens "
               f"({self.max_tokens})")
        bias = self.logit_bias or ()
        if isinstance(bias, dict):
            bias = tuple(sorted(bias.items()))
        _check(isinstance(bias, (list, tuple)) and all(
            isinstance(e, (list, tuple)) and len(e) == 2 and _is_int(e[0]) and e[0] >= 0
            and _is_num(e[1]) and -100.0 <= e[1] <= 100.0 for e in bias), "logit_bias",
            "must map token ids to biases in [-100, 100]")
        object.__setattr__(self, "logit_bias", tuple((int(t), float(b)) for t, b in bias))
        _check(self.prompt_logprobs is None or (_is_int(self.prompt_logprobs)
                                                and 0 <= self.prompt_logprobs <= MAX_LOGPROBS),
               "prompt_logprobs", f"Requested prompt logprobs of {self.prompt_logprobs}, "
               f"which is outside [0, {MAX_LOGPROBS}]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Any of the per-row logit adjustments (sampling/penalties.py) is asked for."""
        return bool(self.presence_penalty or self.frequency_penalty or self.min_tokens
                    or self.logit_bias or self.repetition_penalty != 1.0)
