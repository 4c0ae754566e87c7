"""What every route needs: the EngineClient, the served model's names, and the steps common to completions and chat
(model-name check, tokenization off the event loop, adding a batch of prompts all-or-nothing)."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from cinq.engine.async_engine import RequestStream
from cinq.engine.protocol import EngineClient
from cinq.sampling_params import SamplingParams
from cinq.server.errors import APIError
from cinq.server.metrics import ServerMetrics

_INLINE_TOKENIZE_CHARS = 4096  # longer texts are tokenized in a worker thread, not on the event loop


@dataclass(slots=True)
class Prompt:
    """One prompt as the engine gets it, with the text it came from (None when given as token ids)."""

    token_ids: list[int]
    text: str | None


@dataclass(slots=True)
class ServerContext:
    """What the routes share; the model's tokenizer, limits and sampling defaults are read from ``llm`` itself."""

    llm: EngineClient
    model_names: list[str]  # the first is the name the server reports
    model_path: str
    metrics: ServerMetrics
    api_key: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    def check_model(self, name: str | None) -> None:
        """A request may omit ``model``; naming another model is a 404, as with OpenAI."""
        if name is not None and name not in self.model_names:
            raise APIError(404, f"The model `{name}` does not exist. This server serves {self.model_name!r}.",
                           "model", "model_not_found")

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) <= _INLINE_TOKENIZE_CHARS:
            return self.llm.tokenizer.encode(text, add_special_tokens)
        return await asyncio.to_thread(self.llm.tokenizer.encode, text, add_special_tokens)

    def check_token_ids(self, ids: list[int], param: str) -> None:
        vocab = self.llm.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"{param}: token id {bad} is out of range [0, {vocab})", param, "invalid_value")

    async def add_all(self, request_id: str, prompts: list[Prompt], params: SamplingParams,
                      language: str | None = None) -> list[RequestStream]:
        """Add one engine request per prompt (all tagged ``language``); if any is refused, abort the ones
        already added and raise."""
        arrival = time.time()
        ids = [request_id] if len(prompts) == 1 else [f"{request_id}-{i}" for i in range(len(prompts))]
        # All adds are queued before the engine's next drain, so a batch of prompts starts in one step.
        results = await asyncio.gather(*(self.llm.add_request(rid, p.token_ids, params, p.text, arrival, language)
                                         for rid, p in zip(ids, prompts)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for r in results:
                if not isinstance(r, BaseException):
                    r.abort()
            raise errors[0]
        for rid in ids:
            self.metrics.track(rid, params.n)
        return list(results)

    def release(self, streams: list[RequestStream]) -> None:
        """Abort what is unfinished and drop the per-request state kept for metrics (every route ends here)."""
        for s in streams:
            s.abort()
            self.metrics.release(s.request_id)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
