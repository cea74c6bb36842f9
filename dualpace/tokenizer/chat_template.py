"""Chat templates rendered as transformers renders them, in a sandboxed jinja2 environment.

Same environment options (trim_blocks, lstrip_blocks, loopcontrols), the same helpers
(``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII) and variables
(``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token``, ``tools``...).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from dualpace.errors import CheckpointError


class TemplateError(ValueError):
    """The template rejected the conversation (``raise_exception``) or failed to render."""


def _raise_exception(message):
    raise TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    def __init__(self, source: str):
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise CheckpointError(f"chat template does not compile: {e}") from e
        self.source = source

    def render(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **kwargs
            )
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template failed: {e}") from e


def load_chat_template(model_dir: Path, tokenizer_config: dict) -> ChatTemplate | None:
    """From ``chat_template.jinja`` or ``tokenizer_config.json`` (string or named list)."""
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return ChatTemplate(jinja_file.read_text(encoding="utf-8"))
    source = tokenizer_config.get("chat_template")
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default") or next(iter(named.values()), None)
    if not source:
        return None
    return ChatTemplate(source)
