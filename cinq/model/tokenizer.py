"""Tokenizer: a Hugging Face ``tokenizer.json`` (via the `tokenizers` library) plus what ``tokenizer_config.json``
adds — special tokens, BOS handling, and the chat template rendered with jinja2 (sandboxed, as transformers does)."""

from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from cinq.errors import InvalidParameterError, ModelLoadError


def _token_str(value: Any) -> str | None:
    # tokenizer_config.json stores special tokens either as strings or as AddedToken dicts.
    if isinstance(value, dict):
        return value.get("content")
    return value


class Tokenizer:
    """Encode/decode and chat formatting for one model folder."""

    def __init__(self, tokenizer: HFTokenizer, config: dict[str, Any], eos_token_ids: list[int] | None = None) -> None:
        self._tok = tokenizer
        self.config = config
        self.bos_token = _token_str(config.get("bos_token"))
        self.eos_token = _token_str(config.get("eos_token"))
        self.pad_token = _token_str(config.get("pad_token"))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.pad_token_id = self._tok.token_to_id(self.pad_token) if self.pad_token else None
        eos = [self._tok.token_to_id(self.eos_token)] if self.eos_token else []
        self.eos_token_ids: list[int] = list(dict.fromkeys([i for i in eos + list(eos_token_ids or []) if i is not None]))
        self.add_bos_token = bool(config.get("add_bos_token", False))
        self.chat_template: str | None = config.get("chat_template")
        if isinstance(self.chat_template, list):  # named templates: take "default"
            named = {t["name"]: t["template"] for t in self.chat_template}
            self.chat_template = named.get("default", next(iter(named.values()), None))

    @classmethod
    def from_pretrained(cls, path: str | Path, eos_token_ids: list[int] | None = None) -> Tokenizer:
        """Load ``tokenizer.json`` + ``tokenizer_config.json`` (+ a ``chat_template.jinja`` if present)."""
        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise ModelLoadError(f"{path}: no tokenizer.json (cinq needs a fast-tokenizer file)")
        tok = HFTokenizer.from_file(str(tok_file))
        cfg_file = path / "tokenizer_config.json"
        config = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        jinja = path / "chat_template.jinja"
        if jinja.is_file() and not config.get("chat_template"):
            config["chat_template"] = jinja.read_text()
        return cls(tok, config, eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @cached_property
    def all_special_ids(self) -> frozenset[int]:
        return frozenset(t.id for t in self._tok.get_added_tokens_decoder().values() if t.special) \
            if hasattr(self._tok, "get_added_tokens_decoder") else frozenset()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; with special tokens, BOS is prepended when the config asks for it."""
        ids = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None \
                and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, /,
                            **extra: Any) -> str:
        """Render a conversation with the model's chat template (jinja2, HF conventions)."""
        if not self.chat_template:
            raise InvalidParameterError("messages: this model's tokenizer_config.json has no chat_template",
                                        "messages")
        if not messages:
            raise InvalidParameterError("messages must hold at least one message", "messages")
        try:
            # The fixed variables win over same-named extras (chat_template_kwargs cannot replace the messages).
            return self._template.render({**extra, "messages": messages,
                                          "add_generation_prompt": add_generation_prompt,
                                          "bos_token": self.bos_token or "", "eos_token": self.eos_token or "",
                                          "pad_token": self.pad_token or ""})
        except TemplateError as e:
            raise InvalidParameterError(f"messages: the chat template rejected them: {e}", "messages") from e

    @cached_property
    def _template(self):  # compiled once
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env.filters["tojson"] = lambda v, indent=None, **_: json.dumps(v, indent=indent, ensure_ascii=False)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(self.chat_template)
