"""No silent drops: a field that OpenAI or vLLM define and DualPace does not implement is a
400 naming it, unless its value asks for nothing (the field's no-op value, which clients
such as the ``openai`` SDK and LangChain send by default). Truly unknown fields stay
ignored, as vLLM ignores them.

Each entry: field -> the values that ask for nothing. A field is checked only when present
and not null.
"""

from __future__ import annotations

from dualpace.server.errors import bad_request

_OFF_FLAG = (False,)
_NO_VALUES = ([], {}, "")

# Both endpoints.
COMMON = {
    "use_beam_search": _OFF_FLAG,
    "length_penalty": (1, 1.0),
    "min_p": (0, 0.0),
    "allowed_token_ids": _NO_VALUES,
    "bad_words": _NO_VALUES,
    "guided_json": _NO_VALUES,
    "guided_regex": _NO_VALUES,
    "guided_choice": _NO_VALUES,
    "guided_grammar": _NO_VALUES,
    "guided_decoding_backend": _NO_VALUES,
    "structured_outputs": _NO_VALUES,
    "include_stop_str_in_output": _OFF_FLAG,
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "truncate_prompt_tokens": (),
    "lora_request": (),
    "priority": (0,),
    "logits_processors": _NO_VALUES,
    "prompt_embeds": (),
    "kv_transfer_params": (),
    "vllm_xargs": (),
}
COMPLETIONS = {
    "suffix": ("",),
}
CHAT = {
    "echo": _OFF_FLAG,
    "tools": _NO_VALUES,
    "tool_choice": ("none",),
    "functions": _NO_VALUES,
    "function_call": ("none",),
    "continue_final_message": _OFF_FLAG,
    "documents": _NO_VALUES,
    "chat_template": ("",),
    "chat_template_kwargs": _NO_VALUES,
    "mm_processor_kwargs": _NO_VALUES,
    "reasoning_effort": (),
    "modalities": (["text"],),
    "audio": (),
    "prediction": (),
    "web_search_options": (),
}


def _is_noop(value, allowed) -> bool:
    # bool is an int: False must not pass for 0 where only ints are listed, and vice versa
    return any(type(value) is type(a) and value == a for a in allowed) or (
        isinstance(value, float) and any(type(a) is int and value == a for a in allowed))


def reject_unsupported(body: dict, chat: bool) -> None:
    table = {**COMMON, **(CHAT if chat else COMPLETIONS)}
    for name, allowed in table.items():
        if body.get(name) is None:
            continue
        if not _is_noop(body[name], allowed):
            raise bad_request(f"'{name}' is not supported by this server (DualPace "
                              f"{'chat ' if chat else ''}completions); remove it or send its "
                              f"default", name)
    fmt = body.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
            raise bad_request("'response_format' must be an object with a string 'type'",
                              "response_format")
        if fmt["type"] != "text":
            raise bad_request(f"'response_format' of type {fmt['type']!r} is not supported by "
                              "this server; only 'text'", "response_format")
