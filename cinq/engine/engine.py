"""LLMEngine: add requests, step, abort. One step = schedule -> execute the model -> update requests -> outputs."""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from pathlib import Path
from typing import Any

import torch

from cinq.config import EngineConfig, resolve_model
from cinq.engine.executor import Executor, make_executor
from cinq.engine.io import EngineCoreOutput, RunnerOutput, SchedulerOutput
from cinq.engine.kv_cache import KVCacheManager
from cinq.engine.output_processor import OutputProcessor
from cinq.engine.request import Request, RequestStatus
from cinq.engine.scheduler import Scheduler, SchedulerConfig
from cinq.engine.spec_metrics import check_language, count_language
from cinq.errors import InvalidParameterError, PromptTooLongError
from cinq.model.config import ModelConfig
from cinq.model.generation_defaults import read_sampling_defaults, sampling_defaults_source
from cinq.model.loader import quantization_summary
from cinq.model.tokenizer import Tokenizer
from cinq.outputs import EngineStats, RequestOutput
from cinq.sampling_params import SamplingParams
from cinq.spec.drafter import make_drafter

log = logging.getLogger(__name__)


def available_memory_bytes(device: torch.device) -> int:
    """Free memory on the device (CUDA) or available system memory (CPU, from /proc/meminfo)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


class LLMEngine:
    """The synchronous engine: owns the model runner, the scheduler (with the KV cache manager) and the output
    processor. Not thread-safe; ``AsyncLLM`` drives it from one background loop."""

    def __init__(self, config: EngineConfig) -> None:
        # A model's name ("cinq-tiny") or "" (the default model) becomes its folder before anything reads it; a bad
        # one is one ModelLoadError naming "model", before any work.
        model = resolve_model(config.model, "model")
        self.config = config if model == config.model else dataclasses.replace(config, model=model)
        config = self.config
        self.device = torch.device(config.device)
        # An unset seed draws a fresh one per engine (vLLM's semantics): unseeded samples vary from run to run.
        self.seed: int = config.seed if config.seed is not None else secrets.randbits(32)
        log.debug("sampling seed %d (%s)", self.seed, "given" if config.seed is not None else
                  "drawn at random: pass seed=N / --seed N to repeat this run")
        # What requests that give no sampling parameters get (vLLM's generation_config="auto"); read first, so a
        # broken generation_config.json fails before the model loads.
        self.default_sampling_params: dict[str, Any] = read_sampling_defaults(config.generation_config, model)
        if self.default_sampling_params:
            log.info("default sampling parameters from %s: %s (requests that omit them get these; "
                     "--generation-config vllm ignores them)",
                     sampling_defaults_source(config.generation_config, model), self.default_sampling_params)
        t0 = time.perf_counter()
        self.executor: Executor = make_executor(config, self.seed)
        mcfg = self.model_config
        self.tokenizer = Tokenizer.from_pretrained(config.tokenizer or config.model, mcfg.eos_token_ids)
        self.max_model_len = self._resolve_max_model_len()
        self.num_blocks = self._resolve_num_blocks()
        self.executor.initialize_cache(self.num_blocks)
        kv = KVCacheManager(self.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_num_batched_tokens, config.max_num_seqs, self.max_model_len), kv,
            make_drafter(config.speculative_config))
        self.output_processor = OutputProcessor(self.tokenizer)
        self.stats = EngineStats(num_kv_blocks=self.num_blocks)
        # Requests that failed alone in the last step: request id -> "ErrorType: message" (AsyncLLM turns them
        # into RequestFailedError on their streams). Replaced every step, so it never grows.
        self.failed_requests: dict[str, str] = {}
        self.eos_token_ids = list(dict.fromkeys(self.tokenizer.eos_token_ids + mcfg.eos_token_ids))
        kv_gib = self.num_blocks * self.executor.kv_bytes_per_block(config.block_size) / 2**30
        quant = quantization_summary(mcfg)
        log.info("loaded %s (%s%s, %s, attention=%s) in %.1fs; KV cache: %d blocks x %d tokens = %d tokens "
                 "(%.3f GiB); max_model_len %d", config.model, mcfg.architecture, f", {quant}" if quant else "",
                 config.dtype, self.executor.attention_backend, time.perf_counter() - t0, self.num_blocks,
                 config.block_size, self.num_blocks * config.block_size, kv_gib, self.max_model_len)

    @property
    def model_config(self) -> ModelConfig:
        """The served model's config.json, parsed."""
        return self.executor.model_config

    @property
    def vocab_size(self) -> int:
        """Token ids a prompt may hold: [0, vocab_size)."""
        return self.model_config.vocab_size

    @property
    def model(self) -> torch.nn.Module:
        """The model in this process (benchmarks and tools inspect its weights; serving never needs it)."""
        return self.executor.model  # type: ignore[attr-defined]

    @property
    def kv(self) -> KVCacheManager:
        return self.scheduler.kv

    @property
    def num_waiting(self) -> int:
        """Requests queued but not running (preempted ones included)."""
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    def _resolve_max_model_len(self) -> int:
        mcfg, asked = self.model_config, self.config.max_model_len
        limit = mcfg.max_position_embeddings
        if mcfg.sliding_window and mcfg.sliding_window < limit:
            # No sliding-window attention here: within the window, full attention is exact.
            log.warning("sliding_window %d < max_position_embeddings %d: capping max_model_len at the window",
                        mcfg.sliding_window, limit)
            limit = mcfg.sliding_window
        if asked is None:
            return limit
        if asked > limit:
            raise InvalidParameterError(
                f"max_model_len ({asked}) exceeds what the model supports ({limit})", "max_model_len")
        return asked

    def _resolve_num_blocks(self) -> int:
        cfg = self.config
        if cfg.num_kv_blocks is not None:
            return cfg.num_kv_blocks
        per_block = self.executor.kv_bytes_per_block(cfg.block_size)
        budget = (cfg.kv_cache_memory * 2**30 if cfg.kv_cache_memory is not None
                  else available_memory_bytes(self.device) * cfg.kv_cache_memory_fraction)
        blocks = int(budget // per_block)
        # More than every running sequence at full length can hold only buys a longer prefix-cache memory.
        useful = cfg.max_num_seqs * -(-self.max_model_len // cfg.block_size) + 1
        blocks = min(blocks, useful)
        if blocks < 1:
            raise InvalidParameterError(
                f"kv_cache_memory: {budget / 2**30:.3f} GiB holds no KV block ({per_block} bytes each)",
                "kv_cache_memory")
        return blocks

    # ---- requests ---------------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                    arrival_time: float | None = None, prompt_text: str | None = None,
                    language: str | None = None) -> None:
        """Queue a request (text or token ids). Validates everything first: a bad request changes nothing.

        ``language``: an optional tag (<= 32 of ``[A-Za-z0-9_-]``) under which this request's speculative-decoding
        counters are also counted (``EngineStats.spec_decode_by_language``)."""
        params = params or SamplingParams()
        language = check_language(language)
        if request_id in self.output_processor.parents:
            raise InvalidParameterError(f"request_id {request_id!r} is already in use", "request_id")
        if isinstance(prompt, str):
            prompt_text = prompt
            prompt_ids = self.tokenizer.encode(prompt)
        else:
            prompt_ids = list(prompt)
        self._validate_prompt(prompt_ids)
        max_tokens = self._resolve_max_tokens(len(prompt_ids), params)
        params = params.clone(eos_token_ids=self.eos_token_ids) if not params.eos_token_ids else params
        arrival = arrival_time or time.time()
        child_ids = [request_id] if params.n == 1 else [f"{i}_{request_id}" for i in range(params.n)]
        self.output_processor.add_request(request_id, prompt_text, prompt_ids, params, child_ids, arrival, language)
        for i, cid in enumerate(child_ids):
            child_params = params
            if params.n > 1 and params.seed is not None:
                child_params = params.clone(seed=params.seed + i)
            self.scheduler.add_request(Request(cid, prompt_ids, child_params, max_tokens, arrival))

    def _validate_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise InvalidParameterError("prompt must not be empty", "prompt")
        vocab = self.vocab_size
        bad = next((t for t in prompt_ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab),
                   None)
        if bad is not None:
            raise InvalidParameterError(f"prompt token id {bad!r} is out of range [0, {vocab})", "prompt")

    def _resolve_max_tokens(self, prompt_len: int, params: SamplingParams) -> int:
        limit = self.max_model_len
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
        need = -(-(prompt_len + max(max_tokens, 1)) // self.config.block_size)
        if need > self.num_blocks:
            raise PromptTooLongError(
                f"request needs {need} KV blocks ({prompt_len} prompt + {max_tokens} completion tokens) but the "
                f"whole KV cache has {self.num_blocks} blocks of {self.config.block_size} tokens", "max_tokens")
        return max_tokens

    def abort_request(self, request_ids: str | list[str]) -> None:
        """Stop requests now and free their KV blocks; no further output is produced for them."""
        for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
            children = self.output_processor.child_ids(rid)
            self.scheduler.finish_requests(children, RequestStatus.FINISHED_ABORTED)
            self.output_processor.abort(rid)
            self.stats.finished_by_reason["abort"] = self.stats.finished_by_reason.get("abort", 0) + 1

    def shutdown(self) -> None:
        """Release the executor (a tensor-parallel one stops its worker processes); the engine is done after."""
        self.executor.shutdown()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    # ---- the loop ---------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduler step and return the outputs it produced.

        A request whose own processing raised (a bug in detokenizing or stop checking it, say) is finished alone:
        its final output has finish_reason ``"error"``, its blocks are freed, ``failed_requests`` maps its id to
        the error for this step, and every other request goes on. An error in the batched forward pass itself
        still raises from here (no single request to blame).
        """
        self.failed_requests = {}
        sched = self.scheduler.schedule()
        run = self.executor.execute_model(sched)  # an empty step still drops finished requests' runner state
        if sched.is_empty:
            return []
        core_outputs = self.scheduler.update(sched, run)
        outputs, stopped, failures = self.output_processor.process(core_outputs,
                                                                   [n.request_id for n in sched.new_requests])
        if stopped:
            self.scheduler.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
        for failure in failures:
            self.scheduler.finish_requests(failure.child_ids, RequestStatus.FINISHED_ERROR)
            self.failed_requests[failure.request_id] = failure.error
            log.error("request %s failed inside the engine and was ended alone: %s", failure.request_id,
                      failure.error)
        self._count(sched, run, outputs, core_outputs)
        return outputs

    def _count(self, sched: SchedulerOutput, run: RunnerOutput, outputs: list[RequestOutput],
               core_outputs: list[EngineCoreOutput]) -> None:
        st = self.stats
        st.num_steps += 1
        st.prompt_tokens += sched.num_prompt_tokens
        st.generation_tokens += run.num_sampled_tokens
        languages = self.output_processor.step_languages  # this step's tagged requests, finished ones included
        for core in core_outputs:
            if core.num_draft_tokens:
                st.spec_decode_num_drafts += 1
                st.spec_decode_num_draft_tokens += core.num_draft_tokens
                st.spec_decode_num_accepted_tokens += core.num_accepted_tokens
                per_pos = st.spec_decode_num_accepted_tokens_per_pos
                per_pos.extend([0] * (core.num_draft_tokens - len(per_pos)))
                for pos in range(core.num_accepted_tokens):
                    per_pos[pos] += 1
                language = languages.get(core.request_id)
                if language is not None:
                    count_language(st.spec_decode_by_language, language, core.num_draft_tokens,
                                   core.num_accepted_tokens)
        for out in outputs:
            if out.finished:
                for c in out.outputs:
                    if c.finish_reason:
                        st.finished_by_reason[c.finish_reason] = st.finished_by_reason.get(c.finish_reason, 0) + 1

    def get_stats(self) -> EngineStats:
        """A snapshot of live state and counters."""
        st = self.stats
        kv = self.kv
        st.num_running = self.num_running
        st.num_waiting = self.num_waiting
        st.kv_cache_usage = kv.usage()
        st.prefix_cache_queries = kv.stats.queries
        st.prefix_cache_hits = kv.stats.hits
        st.num_preemptions = self.scheduler.num_preemptions
        snap = EngineStats(**{name: getattr(st, name) for name in st.__dataclass_fields__})
        # The engine keeps counting into its own containers; a snapshot read on another thread must not move.
        snap.finished_by_reason = dict(st.finished_by_reason)
        snap.spec_decode_num_accepted_tokens_per_pos = list(st.spec_decode_num_accepted_tokens_per_pos)
        snap.spec_decode_by_language = {k: dataclasses.replace(v) for k, v in st.spec_decode_by_language.items()}
        return snap
