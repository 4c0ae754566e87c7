"""StructuredOutputManager: one tokenizer's grammar backend and its compiled-grammar cache.

One manager per (tokenizer key, vocabulary size, backend) in a process, shared by the front end (which compiles
to validate: a bad spec is an ``InvalidParameterError`` naming the field and the reason, before the engine sees
it) and the runner (which then finds it compiled). Compiles run on a small thread pool and are bounded by
``compile_timeout_s``: a schema that compiles too slowly fails its request, never the engine. Results and errors
are cached by the spec's canonical text (LRU). structured/ knows no model: its caller hands it the tokenizer
(``GrammarTokenizer``), with the model's end-of-sequence ids among its eos ids."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from cinq.errors import InvalidParameterError
from cinq.structured.backend import GrammarBackend, GrammarMatcher, GrammarTokenizer
from cinq.structured.params import StructuredOutputsParams

log = logging.getLogger(__name__)

DEFAULT_BACKEND = "xgrammar"
BACKENDS = ("xgrammar", "llguidance")
COMPILE_TIMEOUT_S = 10.0
CACHE_SIZE = 256

_managers: dict[tuple[str, int, str], StructuredOutputManager] = {}
_managers_lock = threading.Lock()


def make_backend(name: str, tokenizer: GrammarTokenizer, vocab_size: int) -> GrammarBackend:
    """The named backend over ``tokenizer`` (its eos ids are the stop tokens)."""
    from transformers import PreTrainedTokenizerFast

    stop = list(dict.fromkeys(tokenizer.eos_token_ids)) or [0]
    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    if name == "xgrammar":
        from cinq.structured.xgrammar_backend import XGrammarBackend
        return XGrammarBackend(hf, vocab_size, stop)
    if name == "llguidance":
        from cinq.structured.llguidance_backend import LLGuidanceBackend
        return LLGuidanceBackend(hf, vocab_size, stop)
    raise InvalidParameterError(f"structured_outputs backend must be one of {BACKENDS}, got {name!r}",
                                "structured_outputs_backend")


class StructuredOutputManager:
    """Compiles constraints (cached, time-bounded) and hands out matchers."""

    def __init__(self, backend: GrammarBackend, compile_timeout_s: float = COMPILE_TIMEOUT_S,
                 cache_size: int = CACHE_SIZE) -> None:
        self.backend = backend
        self.compile_timeout_s = compile_timeout_s
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="cinq-grammar")
        self.compile_seconds: dict[tuple[str, str], float] = {}

    @classmethod
    def for_model(cls, tokenizer_key: str, vocab_size: int, load_tokenizer: Callable[[], GrammarTokenizer],
                  backend: str = DEFAULT_BACKEND) -> StructuredOutputManager:
        """The process's manager for the tokenizer named ``tokenizer_key`` (its model folder), built on first use:
        only then is ``load_tokenizer`` called, so a caller may pass a loader that reads files."""
        key = (tokenizer_key, vocab_size, backend)
        with _managers_lock:
            mgr = _managers.get(key)
            if mgr is None:
                mgr = _managers[key] = cls(make_backend(backend, load_tokenizer(), vocab_size))
            return mgr

    def compile(self, spec: StructuredOutputsParams, field: str | None = None) -> Any:
        """The compiled grammar of ``spec``; ``InvalidParameterError`` naming ``field`` (default
        ``structured_outputs.<kind>``) when it does not compile or takes longer than the timeout."""
        key = spec.key()
        field = field or f"structured_outputs.{key[0]}"
        with self._lock:
            fut = self._cache.get(key)
            if fut is None:
                fut = self._cache[key] = self._pool.submit(self._timed_compile, key, spec)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
        try:
            return fut.result(timeout=self.compile_timeout_s)
        except FutureTimeout:
            with self._lock:  # a later request may try again (the machine may have been busy)
                if self._cache.get(key) is fut:
                    del self._cache[key]
            raise InvalidParameterError(
                f"{field}: did not compile within {self.compile_timeout_s:g} s", field) from None
        except ValueError as e:
            raise InvalidParameterError(f"{field}: {e}", field) from None

    def _timed_compile(self, key: tuple[str, str], spec: StructuredOutputsParams) -> Any:
        t0 = time.perf_counter()
        compiled = self.backend.compile(spec)
        self.compile_seconds[key] = time.perf_counter() - t0
        return compiled

    def matcher(self, spec: StructuredOutputsParams) -> GrammarMatcher:
        """A fresh matcher at the start of ``spec``'s grammar."""
        return self.backend.matcher(self.compile(spec))
