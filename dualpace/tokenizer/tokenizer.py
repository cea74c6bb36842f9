"""Tokenizer of a checkpoint: ``tokenizer.json`` through the ``tokenizers`` library."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from dualpace.errors import CheckpointError
from dualpace.tokenizer.chat_template import ChatTemplate, load_chat_template


def _token_content(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


class Tokenizer:
    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(f"{model_dir}: no tokenizer.json")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as e:
            raise CheckpointError(f"{path}: cannot load tokenizer ({e})") from e
        cfg_path = model_dir / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        self.bos_token = _token_content(cfg.get("bos_token"))
        self.eos_token = _token_content(cfg.get("eos_token"))
        self.chat_template: ChatTemplate | None = load_chat_template(model_dir, cfg)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        self.special_ids = frozenset(
            self._tok.token_to_id(t.content)
            for t in self._tok.get_added_tokens_decoder().values()
            if t.special
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary string of ``token_id`` (byte-level forms as the vocabulary has them)."""
        return self._tok.id_to_token(token_id)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, **kwargs
    ) -> str:
        if self.chat_template is None:
            raise ValueError("this model has no chat template; use the completions API")
        return self.chat_template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **kwargs,
        )

    def encode_chat(self, messages: list[dict], **kwargs) -> list[int]:
        # The template already carries BOS and the turn markers (vLLM does the same).
        return self.encode(self.apply_chat_template(messages, **kwargs), add_special_tokens=False)
