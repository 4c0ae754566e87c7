"""InputProcessor: the front end's half of adding a request (vLLM's ``Processor``): tokenize a text prompt,
validate everything against what the core said about itself (``EngineCoreInfo``), resolve ``max_tokens``, fill the
model's eos ids and fan ``n`` out into ``EngineCoreRequest``s. A bad request raises here, in the caller's process,
before anything reaches the core."""

from __future__ import annotations

import time
from dataclasses import dataclass

from cinq.engine.io import EngineCoreInfo, EngineCoreRequest
from cinq.engine.spec_metrics import check_language
from cinq.errors import InvalidParameterError, PromptTooLongError
from cinq.model.tokenizer import Tokenizer
from cinq.sampling_params import SamplingParams


@dataclass(slots=True)
class ProcessedRequest:
    """A validated request: what the output processor tracks and the core requests (one per ``n``)."""

    request_id: str
    prompt_text: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    language: str | None
    core_requests: list[EngineCoreRequest]

    @property
    def child_ids(self) -> list[str]:
        return [r.request_id for r in self.core_requests]


def truncate_prompt(prompt_ids: list[int], truncate_prompt_tokens: int | None, max_model_len: int) -> list[int]:
    """The prompt's last ``truncate_prompt_tokens`` tokens (vLLM's left truncation; -1: ``max_model_len``; None:
    all); a size past the context is an error naming the field, as in vLLM."""
    if truncate_prompt_tokens is None:
        return prompt_ids
    keep = max_model_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens
    if keep > max_model_len:
        raise InvalidParameterError(f"truncate_prompt_tokens ({keep}) is greater than max_model_len "
                                    f"({max_model_len}): choose a smaller truncation size", "truncate_prompt_tokens")
    return prompt_ids[-keep:]


def bad_words_token_ids(tokenizer: Tokenizer, words: list[str]) -> list[list[int]]:
    """Each bad word as the token sequences that spell it at the start of a text and after a space (vLLM's two
    spellings; the spaced one whatever its length: " Tokyo" is one SmolLM2 token where "Tokyo" is two, and vLLM's
    same-length rule let it through)."""
    sequences: list[list[int]] = []
    for word in words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tokenizer.encode(text, add_special_tokens=False)
            if ids and ids not in sequences:
                sequences.append(ids)
    return sequences


class InputProcessor:
    """Validation and fan-out for one core (its vocabulary, context and KV cache size)."""

    def __init__(self, info: EngineCoreInfo, tokenizer: Tokenizer) -> None:
        self.info = info
        self.tokenizer = tokenizer
        # The tokenizer's eos ids and the model's generation-config ones: every request ends on any of them.
        self.eos_token_ids = list(dict.fromkeys(tokenizer.eos_token_ids + info.model_eos_token_ids))

    def process(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                arrival_time: float | None = None, prompt_text: str | None = None,
                language: str | None = None) -> ProcessedRequest:
        """Everything checked first: a bad request raises a ``CinqError`` naming the field and changes nothing."""
        params = params or SamplingParams()
        language = check_language(language)
        if isinstance(prompt, str):
            prompt_text = prompt
            prompt_ids = self.tokenizer.encode(prompt)
        else:
            prompt_ids = list(prompt)
        kept = truncate_prompt(prompt_ids, params.truncate_prompt_tokens, self.info.max_model_len)
        if len(kept) < len(prompt_ids) and prompt_text is not None:
            prompt_text = self.tokenizer.decode(kept, skip_special_tokens=False)  # the text the model sees
        prompt_ids = kept
        self.validate_prompt(prompt_ids)
        self.validate_token_ids(params)
        if params.bad_words and not params.bad_words_token_ids:
            params = params.clone(bad_words_token_ids=bad_words_token_ids(self.tokenizer, params.bad_words))
        max_tokens = self.resolve_max_tokens(len(prompt_ids), params)
        if params.structured_outputs is not None:
            self.compile_structured(params)
        params = params.clone(eos_token_ids=self.eos_token_ids) if not params.eos_token_ids else params
        arrival = arrival_time or time.time()
        child_ids = [request_id] if params.n == 1 else [f"{i}_{request_id}" for i in range(params.n)]
        core_requests = []
        for i, cid in enumerate(child_ids):
            child_params = params
            if params.n > 1 and params.seed is not None:
                child_params = params.clone(seed=params.seed + i)
            core_requests.append(EngineCoreRequest(cid, prompt_ids, child_params, max_tokens, arrival, language))
        return ProcessedRequest(request_id, prompt_text, prompt_ids, params, arrival, language, core_requests)

    def compile_structured(self, params: SamplingParams) -> None:
        """Compile the request's constraint (cached; the core finds it compiled when it shares this process): a bad
        schema, regex or grammar, or one that compiles too slowly, is an InvalidParameterError naming the field."""
        from cinq.engine.structured_outputs import structured_output_manager
        assert params.structured_outputs is not None
        structured_output_manager(self.info.model, self.info.vocab_size).compile(params.structured_outputs)

    def validate_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise InvalidParameterError("prompt must not be empty", "prompt")
        vocab = self.info.vocab_size
        bad = next((t for t in prompt_ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab),
                   None)
        if bad is not None:
            raise InvalidParameterError(f"prompt token id {bad!r} is out of range [0, {vocab})", "prompt")

    def validate_token_ids(self, params: SamplingParams) -> None:
        """The token ids ``logit_bias`` and ``allowed_token_ids`` name must be in the vocabulary (vLLM's check), and
        ``allowed_token_ids`` must leave a token that ``min_tokens`` does not ban."""
        vocab = self.info.vocab_size
        named = (("logit_bias", params.logit_bias or ()), ("allowed_token_ids", params.allowed_token_ids or ()))
        for name, ids in named:
            bad = sorted(t for t in ids if t >= vocab)
            if bad:
                raise InvalidParameterError(f"{name}: token id(s) {bad[:8]} are out of range [0, {vocab})", name)
        allowed = set(params.allowed_token_ids or ())
        ends = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids))
        if allowed and params.min_tokens and allowed <= ends:  # nothing could be sampled before min_tokens
            raise InvalidParameterError(f"allowed_token_ids holds only end tokens {sorted(allowed)[:8]}, which "
                                        f"min_tokens ({params.min_tokens}) bans: nothing could be sampled",
                                        "allowed_token_ids")

    def resolve_max_tokens(self, prompt_len: int, params: SamplingParams) -> int:
        limit, block_size = self.info.max_model_len, self.info.block_size
        num_blocks = self.info.request_blocks or self.info.num_blocks
        if prompt_len >= limit and not (params.max_tokens == 0 and prompt_len == limit):
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens, but the prompt has {prompt_len} tokens",
                "prompt")
        max_tokens = params.max_tokens if params.max_tokens is not None else limit - prompt_len
        if prompt_len + max_tokens > limit:
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} for the completion). "
                f"Please reduce the prompt or max_tokens.", "max_tokens")
        need = -(-(prompt_len + max(max_tokens, 1)) // block_size)
        if need > num_blocks:
            raise PromptTooLongError(
                f"request needs {need} KV blocks ({prompt_len} prompt + {max_tokens} completion tokens) but the "
                f"whole KV cache has {num_blocks} blocks of {block_size} tokens", "max_tokens")
        return max_tokens
