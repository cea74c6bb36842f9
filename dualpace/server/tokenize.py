"""POST /tokenize and POST /detokenize with vLLM's request and response shapes.

/tokenize takes a completions-style ``prompt`` (a string; ``add_special_tokens`` default
true) or a chat-style ``messages`` list (the chat template; ``add_generation_prompt``
default true, ``add_special_tokens`` default false) and answers
``{"count", "max_model_len", "tokens", "token_strs"}``; ``return_token_strs`` fills the
last with each token's vocabulary string. /detokenize takes ``tokens`` and answers
``{"prompt"}``.
"""

from __future__ import annotations

from dualpace.server.errors import bad_request
from dualpace.server.requests import chat_prompt, flag
from dualpace.server.unsupported import reject_unsupported


def tokenize(body: dict, tokenizer, max_model_len: int) -> dict:
    if ("prompt" in body) == ("messages" in body):
        raise bad_request("give exactly one of 'prompt' or 'messages'", "prompt")
    if "messages" in body:
        reject_unsupported(body, chat=True)  # tools, chat_template, ...: as for chat
        tokens = chat_prompt(body, tokenizer)
    else:
        prompt = body["prompt"]
        if not isinstance(prompt, str):
            raise bad_request("'prompt' must be a string", "prompt")
        tokens = tokenizer.encode(prompt, add_special_tokens=flag(body, "add_special_tokens",
                                                                  True))
    strs = None
    if flag(body, "return_token_strs", False):
        strs = [tokenizer.id_to_token(t) for t in tokens]
    return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens,
            "token_strs": strs}


def detokenize(body: dict, tokenizer, vocab_size: int) -> dict:
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad_request("'tokens' must be a list of integers", "tokens")
    bad = [t for t in tokens if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(f"token ids {bad[:8]} are outside the vocabulary [0, {vocab_size})",
                          "tokens")
    return {"prompt": tokenizer.decode(tokens, skip_special_tokens=False)}
