"""Tokenizer: a Hugging Face ``tokenizer.json`` (via the `tokenizers` library) plus what ``tokenizer_config.json``
adds — special tokens and the chat template rendered with jinja2 (sandboxed, as transformers does).

Which special tokens ``encode`` adds is decided by tokenizer.json's post-processor alone, as in transformers 5:
it drops ``add_bos_token`` / ``add_eos_token`` from tokenizer_config.json whenever a tokenizer.json exists
(checked with 5.25.0 for tokenizer_class PreTrainedTokenizerFast, TokenizersBackend, LlamaTokenizer and
LlamaTokenizerFast, on byte-level and Metaspace tokenizer.json files). A folder whose two files disagree loads
with one warning, and cinq gives the ids transformers gives. (Classes that rebuild the backend from the vocabulary
with their own pieces, e.g. CodeLlama, GPTNeoX, Gemma, are not followed: cinq reads tokenizer.json as written.)
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import processors

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.model.folder_files import (MAX_TOKENIZER_BYTES, MAX_TOKENIZER_CONFIG_BYTES, exists, read_json,
                                     regular_file_size)

log = logging.getLogger(__name__)


def _token_str(value: Any) -> str | None:
    # tokenizer_config.json stores special tokens either as strings or as AddedToken dicts.
    if isinstance(value, dict):
        return value.get("content")
    return value


def check_tokenizer_config(config: dict[str, Any], source: str = "tokenizer_config.json") -> None:
    """Refuse the fields this class reads when they have the wrong type (a hostile or corrupted file must not
    surface later as a TypeError deep in the `tokenizers` library); errors name ``source`` and the field."""
    for key in ("bos_token", "eos_token", "pad_token"):
        value = config.get(key)
        if value is not None and not isinstance(value, str) \
                and not (isinstance(value, dict) and isinstance(value.get("content"), str)):
            raise ModelLoadError(f"{source}: '{key}' must be a string or an AddedToken object "
                                 f"{{\"content\": ...}}, got {value!r}")
    template = config.get("chat_template")
    named_ok = isinstance(template, list) and bool(template) and all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
        for t in template)
    if template is not None and not isinstance(template, str) and not named_ok:
        raise ModelLoadError(f"{source}: 'chat_template' must be a string or a non-empty list of "
                             f"{{\"name\", \"template\"}} objects, got {template!r:.80}")


def add_bos_post_processor(tokenizer: HFTokenizer, bos_token: str) -> HFTokenizer:
    """Make ``tokenizer`` prepend ``bos_token`` when special tokens are asked for, in the form transformers' own
    ``update_post_processor`` writes for Llama: single ``bos $A``, pair ``bos $A bos $B`` (type ids 0 and 1).
    Changes ``tokenizer`` in place and returns it; a ``bos_token`` not in its vocabulary is an
    InvalidParameterError naming ``bos_token``."""
    bos_id = tokenizer.token_to_id(bos_token)
    if bos_id is None:
        raise InvalidParameterError(f"bos_token: {bos_token!r} is not in the tokenizer's vocabulary", "bos_token")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos_token}:0 $A:0", pair=f"{bos_token}:0 $A:0 {bos_token}:1 $B:1",
        special_tokens=[(bos_token, bos_id)])
    return tokenizer


def post_processor_adds(tokenizer: HFTokenizer, token_id: int | None, at_start: bool = True) -> bool:
    """Whether ``tokenizer``'s post-processor puts ``token_id`` at the start (or, ``at_start=False``, the end) of an
    encoding. Probed by encoding, so that every post-processor kind (template, Roberta, Sequence, ...) counts."""
    if token_id is None:
        return False
    edge = 0 if at_start else -1
    plain = tokenizer.encode("a", add_special_tokens=False).ids
    full = tokenizer.encode("a", add_special_tokens=True).ids
    return bool(full) and full[edge] == token_id and (not plain or plain[edge] != token_id)


class Tokenizer:
    """Encode/decode and chat formatting for one model folder."""

    def __init__(self, tokenizer: HFTokenizer, config: dict[str, Any], eos_token_ids: list[int] | None = None,
                 *, source: str = "tokenizer") -> None:
        check_tokenizer_config(config)
        self._tok = tokenizer
        self.config = config
        self.bos_token = _token_str(config.get("bos_token"))
        self.eos_token = _token_str(config.get("eos_token"))
        self.pad_token = _token_str(config.get("pad_token"))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.pad_token_id = self._tok.token_to_id(self.pad_token) if self.pad_token else None
        eos = [self._tok.token_to_id(self.eos_token)] if self.eos_token else []
        self.eos_token_ids: list[int] = list(dict.fromkeys([i for i in eos + list(eos_token_ids or []) if i is not None]))
        # What encode() does, from the post-processor; the config's flags only decide whether to warn.
        self.add_bos_token = post_processor_adds(self._tok, self.bos_token_id)
        self._warn_on_disagreement(source)
        self.chat_template: str | None = config.get("chat_template")
        if isinstance(self.chat_template, list):  # named templates: take "default"
            named = {t["name"]: t["template"] for t in self.chat_template}
            self.chat_template = named.get("default", next(iter(named.values()), None))

    @classmethod
    def from_pretrained(cls, path: str | Path, eos_token_ids: list[int] | None = None,
                        chat_template: str | None = None) -> Tokenizer:
        """Load ``tokenizer.json`` + ``tokenizer_config.json`` (+ a ``chat_template.jinja`` if present), or the
        vocabulary of a GGUF file (cinq/model/gguf/tokenizer.py); a file that is missing, too large, not a regular
        file or corrupted is a ModelLoadError naming it. ``chat_template``: a template file's path or the template
        inline, used in place of the model's (model/chat_template.py)."""
        tok = cls._load(Path(path), eos_token_ids)
        if chat_template is not None:
            from cinq.model.chat_template import load_chat_template
            tok.use_chat_template(load_chat_template(chat_template))
        return tok

    @classmethod
    def _load(cls, path: Path, eos_token_ids: list[int] | None) -> Tokenizer:
        path = Path(path)
        from cinq.model.gguf.file import find_gguf_file
        gguf = find_gguf_file(path)
        if gguf is not None and not exists(path / "tokenizer.json"):
            from cinq.model.gguf.model import gguf_hf_tokenizer, gguf_model_config
            config = gguf_model_config(gguf)
            tok, tok_config = gguf_hf_tokenizer(gguf, config.vocab_size)
            return cls(tok, tok_config, list(dict.fromkeys(config.eos_token_ids + list(eos_token_ids or []))),
                       source=str(gguf))
        tok_file = path / "tokenizer.json"
        if not exists(tok_file):
            raise ModelLoadError(f"{path}: no tokenizer.json (cinq needs a fast-tokenizer file)")
        regular_file_size(tok_file, MAX_TOKENIZER_BYTES)
        try:
            tok = HFTokenizer.from_file(str(tok_file))
        except Exception as e:  # noqa: BLE001 - `tokenizers` raises a bare Exception for every parse error
            raise ModelLoadError(f"{tok_file}: cannot be read by the tokenizers library: {e}") from None
        cfg_file = path / "tokenizer_config.json"
        config = read_json(cfg_file, MAX_TOKENIZER_CONFIG_BYTES) if exists(cfg_file) else {}
        check_tokenizer_config(config, str(cfg_file))
        jinja = path / "chat_template.jinja"
        if exists(jinja) and not config.get("chat_template"):
            regular_file_size(jinja, MAX_TOKENIZER_CONFIG_BYTES)
            try:
                config["chat_template"] = jinja.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise ModelLoadError(f"{jinja}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        return cls(tok, config, eos_token_ids, source=str(path))

    def _warn_on_disagreement(self, source: str) -> None:
        """One warning when tokenizer_config.json's add_bos_token / add_eos_token say other than tokenizer.json's
        post-processor does (tokenizer.json wins, as in transformers 5; see the module docstring)."""
        eos_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        actual = {"add_bos_token": (self.add_bos_token, self.bos_token),
                  "add_eos_token": (post_processor_adds(self._tok, eos_id, at_start=False), self.eos_token)}
        clashes = [f"{key} is {str(bool(self.config[key])).lower()} but tokenizer.json's post-processor "
                   f"{'adds' if adds else 'does not add'} {token!r}"
                   for key, (adds, token) in actual.items()
                   if key in self.config and bool(self.config[key]) != adds and token is not None]
        if clashes:
            # A cinq folder written before tokenizer.json carried the BOS is the likely case: say how to repair it.
            log.warning("%s: tokenizer_config.json's %s; following tokenizer.json, as transformers >= 5 does "
                        "(make the two files agree to silence this; for a cinq-written folder missing its BOS, "
                        "cinq.train.tokenizer_train.repair_bos_post_processor(folder) does)", source,
                        "; ".join(clashes))

    @property
    def backend_tokenizer(self) -> HFTokenizer:
        """The ``tokenizers`` library's tokenizer (transformers' name for it; the grammar compilers read it)."""
        return self._tok

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @cached_property
    def all_special_ids(self) -> frozenset[int]:
        return frozenset(t.id for t in self._tok.get_added_tokens_decoder().values() if t.special) \
            if hasattr(self._tok, "get_added_tokens_decoder") else frozenset()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; with special tokens, those tokenizer.json's post-processor adds (for cinq's
        folders, a leading BOS). A text that itself starts with the BOS token gets a second one, as in
        transformers: rendered chat templates, which hold their own BOS, are encoded without special tokens."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, /,
                            **extra: Any) -> str:
        """Render a conversation with the model's chat template (jinja2, HF conventions)."""
        if not self.chat_template:
            raise InvalidParameterError("messages: this model's tokenizer has no chat_template (a base model: "
                                        "send a plain prompt to completions instead)", "messages")
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

    def use_chat_template(self, template: str) -> None:
        """Render conversations with ``template`` (jinja2 text) from now on; one that does not compile is an
        InvalidParameterError naming ``chat_template``, and the tokenizer keeps its own."""
        try:
            compiled = _compile_template(template)
        except TemplateError as e:
            raise InvalidParameterError(f"chat_template does not compile: {e}", "chat_template") from e
        self.chat_template = template
        self.__dict__["_template"] = compiled

    @cached_property
    def _template(self):  # compiled once
        return _compile_template(self.chat_template)


def _compile_template(template: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env.filters["tojson"] = lambda v, indent=None, **_: json.dumps(v, indent=indent, ensure_ascii=False)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)
