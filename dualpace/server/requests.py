"""Validation of OpenAI request bodies into prompts and SamplingParams (vLLM's behaviour:
unknown fields are ignored, every malformed or out-of-range field is a 400 naming it)."""

from __future__ import annotations

from dataclasses import dataclass

from dualpace.sampling.params import SamplingParams
from dualpace.server.errors import APIError, bad_request


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _opt(body: dict, name: str, kind, default):
    if name not in body or body[name] is None:
        return default
    v = body[name]
    ok = {"int": _is_int(v), "num": _is_int(v) or isinstance(v, float),
          "bool": isinstance(v, bool), "str": isinstance(v, str)}[kind]
    if not ok:
        raise bad_request(f"'{name}' must be of type {kind}", name)
    return v


def sampling_params(body: dict, max_tokens_default: int | None,
                    names: tuple[str, ...] = ("max_tokens",),
                    vocab_size: int | None = None) -> SamplingParams:
    n = _opt(body, "n", "int", 1)
    if n < 1:
        raise bad_request(f"'n' must be at least 1, got {n}", "n")
    best_of = _opt(body, "best_of", "int", None)
    if best_of is not None and best_of < n:
        raise bad_request(f"best_of must be greater than or equal to n, got n={n} and "
                          f"best_of={best_of}.", "best_of")
    if best_of is not None and best_of > n:  # would rank best_of samples, return n
        raise bad_request(f"best_of > n is not supported by this server (got n={n} and "
                          f"best_of={best_of}); send best_of equal to n, or omit it",
                          "best_of")
    max_tokens = max_tokens_default
    for name in names:
        v = _opt(body, name, "int", None)
        if v is not None:
            max_tokens = v
            if v < 1:
                raise bad_request(f"'{name}' must be at least 1, got {v}", name)
    stop = body.get("stop")
    if stop is not None and not (isinstance(stop, str) or (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
        raise bad_request("'stop' must be a string or a list of strings", "stop")
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None and not (isinstance(stop_ids, list) and all(
            _is_int(t) for t in stop_ids)):
        raise bad_request("'stop_token_ids' must be a list of integers", "stop_token_ids")
    for t in stop_ids or ():
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            raise bad_request(f"stop_token_ids contains token id {t}, which is outside the "
                              f"vocabulary [0, {vocab_size})", "stop_token_ids")
    chat = "max_completion_tokens" in names
    logprobs = _logprobs(body, chat)
    prompt_lp = _opt(body, "prompt_logprobs", "int", None)
    if not chat and _opt(body, "echo", "bool", False) and logprobs is not None:
        prompt_lp = max(prompt_lp or 0, logprobs)  # echoed prompt tokens carry logprobs
    try:
        return SamplingParams(
            n=n,
            logprobs=logprobs,
            prompt_logprobs=prompt_lp,
            presence_penalty=float(_opt(body, "presence_penalty", "num", 0.0)),
            frequency_penalty=float(_opt(body, "frequency_penalty", "num", 0.0)),
            repetition_penalty=float(_opt(body, "repetition_penalty", "num", 1.0)),
            min_tokens=_opt(body, "min_tokens", "int", 0),
            logit_bias=_logit_bias(body, vocab_size),
            temperature=float(_opt(body, "temperature", "num", 1.0)),
            top_p=float(_opt(body, "top_p", "num", 1.0)),
            top_k=_opt(body, "top_k", "int", -1),
            seed=_opt(body, "seed", "int", None),
            max_tokens=max_tokens,
            stop=stop or (),
            stop_token_ids=stop_ids or (),
            ignore_eos=_opt(body, "ignore_eos", "bool", False),
        )
    except ValueError as e:
        field = str(e).split(":", 1)[0]
        raise bad_request(str(e), field) from None


@dataclass(frozen=True)
class StreamFlags:
    stream: bool
    include_usage: bool  # a final chunk with the usage
    continuous_usage: bool  # usage so far in every chunk (vLLM's continuous_usage_stats)


def _logit_bias(body: dict, vocab_size: int | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias}: every bad key named at once, ids checked against the
    vocabulary (vLLM's checks; biases in [-100, 100] are checked by SamplingParams)."""
    raw = body.get("logit_bias")
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise bad_request("'logit_bias' must be an object mapping token ids to biases",
                          "logit_bias")
    bad_keys = [k for k in raw if not (isinstance(k, str) and k.strip().lstrip("-").isdigit())]
    if bad_keys:
        raise bad_request(f"logit_bias keys must be token ids (integers); invalid: "
                          f"{', '.join(repr(k) for k in bad_keys)}", "logit_bias")
    bad_vals = [k for k, v in raw.items() if not (isinstance(v, (int, float))
                                                  and not isinstance(v, bool))]
    if bad_vals:
        raise bad_request(f"logit_bias values must be numbers; invalid for token id(s) "
                          f"{', '.join(bad_vals)}", "logit_bias")
    ids = {int(k): float(v) for k, v in raw.items()}
    oov = sorted(t for t in ids if t < 0 or (vocab_size is not None and t >= vocab_size))
    if oov:
        raise bad_request(f"token_id(s) {oov} in logit_bias contain out-of-vocab token ids. "
                          f"Vocabulary size: {vocab_size}", "logit_bias")
    return tuple(sorted(ids.items()))


def _logprobs(body: dict, chat: bool) -> int | None:
    """k for SamplingParams: completions ``logprobs: k``; chat ``logprobs: true`` with
    ``top_logprobs: k`` (0 when absent). vLLM's limits and wording."""
    if not chat:
        return _opt(body, "logprobs", "int", None)
    want = _opt(body, "logprobs", "bool", False)
    k = _opt(body, "top_logprobs", "int", None)
    if k is not None and not want and k > 0:
        raise bad_request("when using `top_logprobs`, `logprobs` must be set to true.",
                          "top_logprobs")
    if k is not None and k < 0:
        raise bad_request(f"`top_logprobs` must be a positive value, got {k}", "top_logprobs")
    return (k or 0) if want else None


def stream_flags(body: dict) -> StreamFlags:
    stream = _opt(body, "stream", "bool", False)
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    if opts is not None and not stream:
        raise bad_request("Stream options can only be defined when `stream=True`.",
                          "stream_options")
    flags = {}
    for key in ("include_usage", "continuous_usage_stats"):
        v = (opts or {}).get(key)
        if v is not None and not isinstance(v, bool):
            raise bad_request(f"'stream_options.{key}' must be a boolean", "stream_options")
        flags[key] = bool(v)
    return StreamFlags(stream, flags["include_usage"], flags["continuous_usage_stats"])


def flag(body: dict, name: str, default: bool) -> bool:
    return _opt(body, name, "bool", default)


def check_model(body: dict, served: str) -> str:
    model = body.get("model", served)
    if model is None:
        return served
    if not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    if model != served:
        raise APIError(404, f"The model `{model}` does not exist.", "model")
    return model


def completion_prompts(body: dict, tokenizer) -> tuple[list[list[int]], list[str]]:
    """The prompts' token ids, and their texts (as given, or decoded from ids: what echo
    returns)."""
    if "prompt" not in body:
        raise bad_request("'prompt' is required", "prompt")
    p = body["prompt"]
    if isinstance(p, str) or (isinstance(p, list) and p and all(_is_int(t) for t in p)):
        items = [p]
    elif isinstance(p, list) and p and (
            all(isinstance(x, str) for x in p)
            or all(isinstance(x, list) and all(_is_int(t) for t in x) for x in p)):
        items = p
    else:
        raise bad_request("'prompt' must be a string, a list of strings, a list of token "
                          "ids or a list of token-id lists, and not empty", "prompt")
    prompts, texts = [], []
    for it in items:
        if not it:
            raise bad_request("'prompt' must not be empty", "prompt")
        # Token ids are range-checked against the vocabulary by the engine.
        if isinstance(it, str):
            prompts.append(tokenizer.encode(it))
            texts.append(it)
        else:
            prompts.append(list(it))
            texts.append(None)
    return prompts, texts


def chat_prompt(body: dict, tokenizer) -> list[int]:
    """The chat template's prompt, tokenized; ``add_generation_prompt`` (default true) and
    ``add_special_tokens`` (default false: the template carries BOS) as vLLM reads them."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request("'messages' must be a non-empty list", "messages")
    norm = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request("each message needs a string 'role'", "messages")
        # Only an assistant turn may omit content (it then carried tool calls elsewhere).
        if "content" not in m and m["role"] != "assistant":
            raise bad_request(f"messages[{i}] ({m['role']!r}) has no 'content'", "messages")
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise bad_request("only text content parts are supported", "messages")
                parts.append(part["text"])
            content = "".join(parts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise bad_request("message 'content' must be a string or a list of text parts",
                              "messages")
        norm.append({"role": m["role"], "content": content})
    gen = flag(body, "add_generation_prompt", True)
    special = flag(body, "add_special_tokens", False)
    try:
        text = tokenizer.apply_chat_template(norm, add_generation_prompt=gen)
        return tokenizer.encode(text, add_special_tokens=special)
    except ValueError as e:
        raise bad_request(str(e), "messages") from None
