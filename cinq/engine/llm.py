"""LLM: the offline API — ``LLM(model, **engine_args).generate(prompts, SamplingParams(...))`` and ``chat``."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cinq.config import EngineConfig
from cinq.engine.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams
from cinq.engine.protocol import OfflineEngine, check_engine_core, default_offline_engine_core, make_llm_engine
from cinq.engine.spec_metrics import check_language
from cinq.errors import InvalidParameterError
from cinq.model.generation_defaults import fill_defaults
from cinq.outputs import RequestOutput
from cinq.sampling_params import OutputKind, SamplingParams

Prompt = str | list[int] | dict[str, Any]


class LLM:
    """Batch generation over a local Hugging Face model folder or an embedded model by name ("cinq-tiny",
    "cinq-tiny-student"; None: the default model).

    ``engine_core``: ``"process"`` runs the engine core in its own process behind ZMQ (``MPLLMEngine``), so
    detokenizing here overlaps the next step there; ``"inproc"`` runs it in this process (``LLMEngine``;
    ``llm.engine`` then exposes the model and the scheduler to tools). None (default): ``$CINQ_ENGINE_CORE``, else
    ``"process"`` (vLLM v1's default); on offline batches the two measure within run-to-run spread (process /
    in-process 0.97x-1.03x on SmolLM2-135M, 0.94x-1.08x on cinq-tiny; 48 prompts, median of 3 rotated rounds,
    two quiet runs, benchmarks/offline_engine_core.py)."""

    def __init__(self, model: str | Path | None = None, engine_core: str | None = None,
                 **engine_args: Any) -> None:
        engine_core = engine_core or default_offline_engine_core()
        check_engine_core(engine_core)  # before a model is loaded
        config = EngineConfig.from_kwargs("" if model is None else str(model), **engine_args)
        self.engine: OfflineEngine | Any = make_llm_engine(config, engine_core)  # type: ignore[arg-type]
        self._ids = itertools.count()
        self.errors: dict[str, str] = {}  # request id -> error, for requests of the last call that failed alone

    def shutdown(self) -> None:
        """Stop the engine (a core process, tensor-parallel workers); the LLM is done after."""
        self.engine.shutdown()

    def get_default_sampling_params(self) -> SamplingParams:
        """What ``generate``/``chat`` use when given no sampling parameters: the model's generation config
        (``generation_config="auto"``, as vLLM), else SamplingParams' defaults."""
        return SamplingParams(**fill_defaults({}, self.engine.default_sampling_params))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def get_tokenizer(self):
        """The model's tokenizer (vLLM's ``LLM.get_tokenizer``)."""
        return self.engine.tokenizer

    @property
    def model(self):
        return self.engine.model

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = False, language: str | Sequence[str | None] | None = None
                 ) -> list[RequestOutput]:
        """Generate for every prompt (strings, token-id lists, or {"prompt"/"prompt_token_ids": ...} dicts);
        returns final outputs in prompt order; no ``sampling_params``: ``get_default_sampling_params()``. A
        request whose own processing failed inside the engine comes back with finish_reason ``"error"`` on its
        unfinished completions (text so far; the error is logged and in ``self.errors``); the other requests are
        unaffected.

        ``language``: a tag for every prompt, or one per prompt (None: untagged), labelling their
        speculative-decoding counters in ``engine.get_stats().spec_decode_by_language``."""
        prompts = _normalize_prompts(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or self.get_default_sampling_params()] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise InvalidParameterError(
                    f"sampling_params: got {len(params_list)} for {len(prompts)} prompts", "sampling_params")
        if isinstance(language, (list, tuple)):
            languages = list(language)
            if len(languages) != len(prompts):
                raise InvalidParameterError(f"language: got {len(languages)} for {len(prompts)} prompts", "language")
        else:
            languages = [language] * len(prompts)
        languages = [check_language(tag) for tag in languages]  # before anything is queued
        ids = []
        try:
            for prompt, params, lang in zip(prompts, params_list, languages):
                rid = f"llm-{next(self._ids)}"
                text, tokens = _split_prompt(prompt)
                self.engine.add_request(rid, tokens if tokens is not None else text,
                                        params.clone(output_kind=OutputKind.FINAL_ONLY), prompt_text=text,
                                        language=lang)
                ids.append(rid)
        except ValueError:
            self.engine.abort_request(ids)  # all or nothing
            raise
        return self._run(ids, use_tqdm)

    def chat(self, messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
             sampling_params: SamplingParams | None = None, use_tqdm: bool = False,
             chat_template: str | None = None, add_generation_prompt: bool | None = None,
             continue_final_message: bool = False, chat_template_kwargs: dict[str, Any] | None = None,
             language: str | Sequence[str | None] | None = None) -> list[RequestOutput]:
        """Render each conversation with the model's chat template (or ``chat_template``: a file's path or the
        template inline) and generate the assistant's reply, as vLLM's ``LLM.chat``: ``continue_final_message``
        leaves the final message open for the model to go on writing (``add_generation_prompt``, true unless
        continuing, must not then be true); ``chat_template_kwargs`` are the template's extra variables;
        ``language``: as in ``generate``."""
        from cinq.model.chat_template import generation_flags, load_chat_template, render_conversation
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        tok = self.tokenizer
        if chat_template is not None:
            tok = copy.copy(tok)  # this call's template only
            tok.use_chat_template(load_chat_template(chat_template))
        add = generation_flags(conversations[0], add_generation_prompt is not False,
                               add_generation_prompt is not None, continue_final_message)
        texts = [render_conversation(tok, conv, add, continue_final_message, chat_template_kwargs)
                 for conv in conversations]
        prompts = [{"prompt_token_ids": tok.encode(t, add_special_tokens=False)} for t in texts]
        return self.generate(prompts, sampling_params, use_tqdm, language)

    def beam_search(self, prompts: Prompt | Sequence[Prompt], params: BeamSearchParams,
                    use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """vLLM's ``LLM.beam_search``: the ``params.beam_width`` best continuations of each prompt, best first
        (engine/beam_search.py: one-token generations of every live beam per step, all prompts batched)."""
        prompts = _normalize_prompts(prompts)
        tok = self.tokenizer
        searches = []
        for prompt in prompts:
            text, tokens = _split_prompt(prompt)
            ids = tokens if tokens is not None else tok.encode(text)
            searches.append(BeamSearch(ids, params, tok.eos_token_ids, self.engine.max_model_len))
        step = params.step_params()
        while any(not s.done for s in searches):
            active = [s for s in searches if not s.done]
            outs = self.generate([{"prompt_token_ids": b.tokens} for s in active for b in s.live], step, use_tqdm)
            for s in active:
                n = len(s.live)
                s.advance(outs[:n])
                outs = outs[n:]
        results = []
        for s in searches:
            best = s.result()
            for beam in best:
                beam.text = tok.decode(s.generated(beam))
            results.append(BeamSearchOutput(best))
        return results

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        results: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm
            bar = tqdm(total=len(ids), desc="requests", unit="req")
        self.errors = {}
        while len(results) < len(ids) and self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.request_id in self.engine.failed_requests:
                    self.errors[out.request_id] = self.engine.failed_requests[out.request_id]
                if out.finished:
                    results[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [results[i] for i in ids]


def _normalize_prompts(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [prompts]  # one prompt given as token ids
    return prompts


def _split_prompt(prompt: Prompt) -> tuple[str | None, list[int] | None]:
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        if "prompt" in prompt:
            return prompt["prompt"], None
        raise InvalidParameterError("prompt dicts need 'prompt' or 'prompt_token_ids'", "prompt")
    if isinstance(prompt, (list, tuple)):
        return None, list(prompt)
    raise InvalidParameterError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}",
                                "prompt")
