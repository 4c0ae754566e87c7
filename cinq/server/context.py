"""What every route needs: the EngineClient, the served model's names, and the steps common to completions and chat
(model-name check, tokenization off the event loop, adding a batch of prompts all-or-nothing)."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from cinq.engine.async_engine import RequestStream
from cinq.engine.input_processor import truncate_prompt
from cinq.engine.protocol import EngineClient
from cinq.errors import PromptTooLongError
from cinq.sampling_params import SamplingParams
from cinq.server.errors import APIError
from cinq.server.metrics import ServerMetrics
from cinq.server.prompt_bound import max_prompt_bytes

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
    # The most UTF-8 bytes a prompt that fits the context can have (server/prompt_bound.py; None: no bound)
    max_prompt_bytes: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.max_prompt_bytes = max_prompt_bytes(self.llm.tokenizer.backend_tokenizer, self.llm.max_model_len)

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    def check_model(self, name: str | None) -> None:
        """A request may omit ``model``; naming another model is a 404, as with OpenAI."""
        if name is not None and name not in self.model_names:
            raise APIError(404, f"The model `{name}` does not exist. This server serves {self.model_name!r}.",
                           "model", "model_not_found")

    async def encode(self, text: str, add_special_tokens: bool = True, limit_param: str | None = None) -> list[int]:
        """Token ids of ``text``. With ``limit_param`` (the request field the text came from) a text too long to fit
        the context in any tokenization is refused first, untokenized: a 400 context_length_exceeded."""
        if limit_param is not None:
            self.check_fits(text, limit_param)
        if len(text) <= _INLINE_TOKENIZE_CHARS:
            return self.llm.tokenizer.encode(text, add_special_tokens)
        # encode_batch lets go of the GIL while it works (encode holds it: a long text stalled every other
        # request, /health included); one text in, the same ids out.
        batch = self.llm.tokenizer.backend_tokenizer.encode_batch
        (encoding,) = await asyncio.to_thread(batch, [text], add_special_tokens=add_special_tokens)
        return encoding.ids

    def check_fits(self, text: str, param: str) -> None:
        """Refuse a text with more UTF-8 bytes than ``max_model_len`` tokens of this tokenizer can spell."""
        limit = self.max_prompt_bytes
        if limit is None or len(text) <= limit // 4:  # a character is at most 4 bytes: no need to encode it
            return
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > limit:
            context = self.llm.max_model_len
            raise PromptTooLongError(
                f"This model's maximum context length is {context} tokens, but the prompt is {size} bytes long: "
                f"more than {context} tokens of its tokenizer can hold (at most {limit} bytes)", param)

    def check_token_ids(self, ids: list[int], param: str) -> None:
        vocab = self.llm.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"{param}: token id {bad} is out of range [0, {vocab})", param, "invalid_value")

    def truncate(self, prompt: Prompt, params: SamplingParams) -> Prompt:
        """``prompt`` cut to the request's ``truncate_prompt_tokens`` (its last tokens), so that usage counts and
        echo show what the model sees; the engine's own cut then keeps it whole."""
        ids = truncate_prompt(prompt.token_ids, params.truncate_prompt_tokens, self.llm.max_model_len)
        if len(ids) == len(prompt.token_ids):
            return prompt
        return Prompt(ids, None if prompt.text is None else self.llm.tokenizer.decode(ids, skip_special_tokens=False))

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
        for rid, p in zip(ids, prompts):
            self.metrics.track(rid, params.n, len(p.token_ids))
        return list(results)

    def release(self, streams: list[RequestStream]) -> None:
        """Abort what is unfinished and drop the per-request state kept for metrics (every route ends here)."""
        for s in streams:
            s.abort()
            self.metrics.release(s.request_id)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
