"""EngineCore: the scheduler, the executor and the step loop, nothing else (vLLM v1's ``EngineCore``).

It takes ``EngineCoreRequest``s (token ids, resolved sampling parameters) and aborts, and each ``step()`` gives
``EngineCoreOutputs``: the new token ids, logprobs and token-level finish reasons of every request that moved, and
the core's stats. It never sees text: tokenizing, detokenizing and stop strings are the front end's
(``LLMEngine`` / ``AsyncMPLLM`` with the ``OutputProcessor``); a stop string found there comes back as
``abort_requests(..., FINISHED_STOPPED)``. The same object runs in the caller's process (``LLMEngine``,
``AsyncLLM``) or in its own (``engine/core_proc.py``, behind ZMQ), so the core publishes every number a caller
needs (``get_stats``) and no caller reaches into the scheduler.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

import torch

from cinq.config import EngineConfig, resolve_model
from cinq.engine.executor import Executor, make_executor
from cinq.engine.io import EngineCoreInfo, EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
from cinq.engine.kv_cache import KVCacheManager
from cinq.engine.kv_cache_groups import (HybridKVCacheManager, make_hybrid_kv_cache_manager, split_kv_blocks,
                                         uses_kv_cache_groups)
from cinq.engine.kv_cache_virtual import VirtualKVCacheManager, build_virtual_kv
from cinq.engine.sliding_window import make_kv_cache_manager
from cinq.engine.scheduler import Scheduler, SchedulerConfig
from cinq.engine.spec_metrics import count_language
from cinq.engine.step_profile import profile_decode_rows, profile_rows
from cinq.errors import InvalidParameterError
from cinq.model.config import ModelConfig
from cinq.model.generation_defaults import read_sampling_defaults, sampling_defaults_source
from cinq.model.loader import quantization_summary
from cinq.outputs import EngineStats
from cinq.spec.drafter import make_drafter
from cinq.spec.row_cost import RowCurve
from cinq.step.request import Request, RequestStatus
from cinq.step.runner_output import RunnerOutput
from cinq.step.scheduler_output import SchedulerOutput

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


class EngineCore:
    """Scheduler + executor + step. Not thread-safe: one thread drives it (the caller's, ``AsyncLLM``'s engine
    thread, or the core process's main loop)."""

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
        self.max_model_len = self._resolve_max_model_len()
        self.num_blocks = self._resolve_num_blocks()
        kv: KVCacheManager | VirtualKVCacheManager | HybridKVCacheManager
        if config.kv_cache_layout == "virtual":  # the same memory budget, as pages of per-request ranges
            if mcfg.sliding_window:  # the contiguous backend attends over the whole range: no window mask
                self.executor.shutdown()
                raise InvalidParameterError(
                    f"kv_cache_layout 'virtual' does not support sliding-window attention (this model's window is "
                    f"{mcfg.sliding_window} tokens): use kv_cache_layout 'paged'", "kv_cache_layout")
            kv = build_virtual_kv(self.executor, self.num_blocks, config.block_size, config.max_num_seqs,
                                  self.max_model_len)
        elif uses_kv_cache_groups(mcfg):  # full and sliding-window layers: one pool each, out-of-window blocks freed
            groups = split_kv_blocks(mcfg, self.num_blocks, config.block_size, self.max_model_len,
                                     config.max_num_batched_tokens)
            log.info("KV cache groups: %d blocks for the full-attention layers, %d for the sliding-window layers "
                     "(the budget of %d shared blocks)", groups[0], groups[1], self.num_blocks)
            self.executor.initialize_cache(groups)
            kv = make_hybrid_kv_cache_manager(mcfg, groups, config.block_size, config.enable_prefix_caching)
            scratch: tuple[list[int], list[list[int]] | None] | None = ([groups[0]], [[g] for g in groups])
        else:
            self.executor.initialize_cache(self.num_blocks)
            kv = make_kv_cache_manager(mcfg, self.num_blocks, config.block_size, config.enable_prefix_caching)
            scratch = ([self.num_blocks], None)  # the runner's first scratch block: past the pool
        if config.kv_cache_layout == "virtual":
            scratch = None  # slots are per-request ranges: no scratch block to profile in
        try:
            self.scheduler = Scheduler(
                SchedulerConfig(config.max_num_batched_tokens, config.max_num_seqs, self.max_model_len), kv,
                make_drafter(config.speculative_config))
            adaptive = getattr(self.scheduler.drafter, "adaptive", None)
            if adaptive is not None and scratch is not None:  # adaptive k prices verify rows by the profile
                rows = profile_rows(min(config.max_num_seqs * (adaptive.k_max + 1), config.max_num_batched_tokens))
                adaptive.row_curve = RowCurve.of(profile_decode_rows(self.executor, rows, *scratch))
        except BaseException:
            self.executor.shutdown()
            raise
        self.stats = EngineStats(num_kv_blocks=self.num_blocks)
        self.num_step_failures = 0
        self._languages: dict[str, str] = {}  # tagged live requests: id -> tag (spec-decode counters)
        kv_gib = self.num_blocks * self.executor.kv_bytes_per_block(config.block_size) / 2**30
        quant = quantization_summary(mcfg)
        log.info("loaded %s (%s%s, %s, attention=%s) in %.1fs; KV cache: %d blocks x %d tokens = %d tokens "
                 "(%.3f GiB); max_model_len %d", config.model, mcfg.architecture, f", {quant}" if quant else "",
                 config.dtype, self.executor.attention_backend, time.perf_counter() - t0, self.num_blocks,
                 config.block_size, self.num_blocks * config.block_size, kv_gib, self.max_model_len)
        if self.num_blocks * config.block_size < self.max_model_len:
            # vLLM refuses to start here; cinq serves, and refuses each request that would not fit (naming both
            # numbers), so a small pool set on purpose (tests, a tight host) keeps working
            log.warning("the KV cache holds %d tokens (num_kv_blocks %d x block_size %d), fewer than max_model_len "
                        "%d: requests needing more are refused; raise num_kv_blocks / kv_cache_memory or lower "
                        "max_model_len", self.num_blocks * config.block_size, self.num_blocks, config.block_size,
                        self.max_model_len)
        spec = config.speculative_config
        if spec is not None:  # as vLLM, the speculation in force is said at start-up
            log.info("speculative decoding: %s, num_speculative_tokens %d%s%s", spec.method,
                     spec.num_speculative_tokens, f", model {spec.model}" if spec.model else "",
                     ", adaptive k" if spec.adaptive else "")

    @property
    def model_config(self) -> ModelConfig:
        return self.executor.model_config

    @property
    def kv(self) -> KVCacheManager | VirtualKVCacheManager:
        return self.scheduler.kv

    def info(self) -> EngineCoreInfo:
        """What a front end needs to know about this core (sent once, at start-up, by the core process)."""
        mcfg = self.model_config
        return EngineCoreInfo(self.config.model, mcfg.architecture, mcfg.vocab_size, self.max_model_len,
                              self.num_blocks, self.config.block_size, list(mcfg.eos_token_ids),
                              dict(self.default_sampling_params), self.seed, self.executor.attention_backend,
                              os.getpid(), self.executor.kv_bytes_per_block(self.config.block_size),
                              served_weight_bytes(self.executor), step_read_bytes(self.executor),
                              self.kv.num_blocks if isinstance(self.kv, HybridKVCacheManager) else self.num_blocks)

    def _resolve_max_model_len(self) -> int:
        mcfg, asked = self.model_config, self.config.max_model_len
        limit = mcfg.max_position_embeddings
        if mcfg.sliding_window and mcfg.sliding_window < limit and not mcfg.has_local_layers:
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
    def add_request(self, req: EngineCoreRequest) -> None:
        """Queue one sequence (validated by the front end). A constraint is compiled here first (cached: in the
        front end's process it is already), so one that fails fails this request alone, before it is queued."""
        if req.sampling_params.structured_outputs is not None:
            from cinq.engine.structured_outputs import structured_output_manager
            structured_output_manager(self.config.model, self.model_config.vocab_size).compile(
                req.sampling_params.structured_outputs)
        self.scheduler.add_request(Request(req.request_id, req.prompt_token_ids, req.sampling_params,
                                           req.max_tokens, req.arrival_time))
        if req.language is not None:
            self._languages[req.request_id] = req.language

    def abort_requests(self, request_ids: list[str],
                       status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> list[str]:
        """Finish these sequences now (an abort, a stop string or an error the front end found) and free their
        blocks; unknown or finished ids are skipped. Returns the ids that were ended. An abort counts once per
        call (one client request), stops and errors once per sequence, as the front end's outputs count them."""
        done = [r.request_id for r in self.scheduler.finish_requests(request_ids, status)]
        for rid in request_ids:
            self._languages.pop(rid, None)
        reasons = self.stats.finished_by_reason
        if status is RequestStatus.FINISHED_ABORTED:
            if done:
                reasons["abort"] = reasons.get("abort", 0) + 1
        elif done:
            reasons[status.value] = reasons.get(status.value, 0) + len(done)
        return done

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    def shutdown(self) -> None:
        """Release the executor (a tensor-parallel one stops its worker processes)."""
        self.executor.shutdown()

    # ---- the loop ---------------------------------------------------------------------------------------------
    def step(self) -> EngineCoreOutputs:
        """Schedule, run the model, update the requests. An error in one request's update ends that request alone
        (its output has finish_reason "error" and ``error`` set); an error in the batched forward pass raises."""
        sched = self.scheduler.schedule()
        run = self.executor.execute_model(sched)  # an empty step still drops finished requests' runner state
        if sched.is_empty:
            return EngineCoreOutputs(timestamp=time.time())
        outputs = self.scheduler.update(sched, run)
        self._count(sched, run, outputs)
        return EngineCoreOutputs(outputs, [n.request_id for n in sched.new_requests], timestamp=time.time())

    def fail_all(self, error: BaseException) -> EngineCoreOutputs:
        """After a step raised: end every request the core holds (their blocks freed) and say which."""
        self.num_step_failures += 1
        ids = list(self.scheduler.requests)
        try:
            self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ERROR)
        except Exception:
            log.exception("could not end the requests of a failed step")
        self._languages.clear()
        return EngineCoreOutputs(stats=self.get_stats(), timestamp=time.time(),
                                 step_error=f"{type(error).__name__}: {error}", failed_request_ids=ids)

    def _count(self, sched: SchedulerOutput, run: RunnerOutput, core_outputs: list[EngineCoreOutput]) -> None:
        st = self.stats
        st.num_steps += 1
        st.prompt_tokens += sched.num_prompt_tokens
        st.generation_tokens += run.num_sampled_tokens
        reasons = st.finished_by_reason
        for core in core_outputs:
            if core.num_draft_tokens:
                st.spec_decode_num_drafts += 1
                st.spec_decode_num_draft_tokens += core.num_draft_tokens
                st.spec_decode_num_accepted_tokens += core.num_accepted_tokens
                per_pos = st.spec_decode_num_accepted_tokens_per_pos
                per_pos.extend([0] * (core.num_draft_tokens - len(per_pos)))
                for pos in range(core.num_accepted_tokens):
                    per_pos[pos] += 1
                language = self._languages.get(core.request_id)
                if language is not None:
                    count_language(st.spec_decode_by_language, language, core.num_draft_tokens,
                                   core.num_accepted_tokens)
            if core.finish_reason is not None:
                reasons[core.finish_reason] = reasons.get(core.finish_reason, 0) + 1
                self._languages.pop(core.request_id, None)

    def get_stats(self) -> EngineStats:
        """A snapshot of live state and counters (safe to hand to another thread: nothing in it moves)."""
        st = self.stats
        kv = self.kv
        st.num_running = self.num_running
        st.num_waiting = self.num_waiting
        st.kv_cache_usage = kv.usage()
        st.prefix_cache_queries = kv.stats.queries
        st.prefix_cache_hits = kv.stats.hits
        st.num_preemptions = self.scheduler.num_preemptions
        block_size, slots, tokens = self.config.block_size, 0, 0
        for req in self.scheduler.running:
            entry = kv.requests.get(req.request_id)
            if isinstance(kv, VirtualKVCacheManager):  # a slot's reservation, in tokens
                held = entry.num_tokens if entry is not None else 0
            else:
                held = len(entry.blocks) * block_size if entry is not None else 0
            slots += held
            tokens += min(req.num_computed_tokens, held)
        st.kv_slots_held, st.kv_tokens_held = slots, tokens
        snap = EngineStats(**{name: getattr(st, name) for name in st.__dataclass_fields__})
        snap.finished_by_reason = dict(st.finished_by_reason)
        snap.spec_decode_num_accepted_tokens_per_pos = list(st.spec_decode_num_accepted_tokens_per_pos)
        snap.spec_decode_by_language = {k: dataclasses.replace(v) for k, v in st.spec_decode_by_language.items()}
        return snap


def module_bytes(*modules: Any) -> int:
    """Bytes of the distinct tensors (parameters and buffers) of torch modules; a tensor two modules share (a
    head tied to the target's embeddings) counts once; anything not a module counts nothing."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for m in modules:
        if not isinstance(m, torch.nn.Module):
            continue
        for t in [*m.parameters(), *m.buffers()]:
            key = (t.untyped_storage().data_ptr(), t.storage_offset())
            if key not in seen:
                seen.add(key)
                total += t.numel() * t.element_size()
    return total


def _served_modules(executor: Executor) -> list[Any]:
    proposer = getattr(executor, "proposer", None)
    extra = list(vars(proposer).values()) if proposer is not None and hasattr(proposer, "__dict__") else []
    return [getattr(executor, "model", None), *extra]


def step_read_bytes(executor: Executor) -> int:
    """The weight bytes one decode step streams (the bandwidth roofline's bytes): ``served_weight_bytes`` less every
    token-embedding table that no other module shares, since a lookup reads one row of it per token. A GGUF file
    whose tied embedding is Q8_0 is served with its LM head on those blocks and a bf16 copy for the lookup: counting
    that copy put SmolLM2's q4_0 decode at 146 MB a token where it reads 90."""
    modules = [m for m in _served_modules(executor) if isinstance(m, torch.nn.Module)]
    others: set[int] = set()
    tables: dict[int, int] = {}
    for root in modules:
        for m in root.modules():
            # by the tensor's own address: packed weights (engine/weight_arena.py) all share one storage
            for t in m.parameters(recurse=False) if isinstance(m, torch.nn.Embedding) else ():
                tables[t.data_ptr()] = t.numel() * t.element_size()
            if not isinstance(m, torch.nn.Embedding):
                for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)]:
                    others.add(t.data_ptr())
    return module_bytes(*modules) - sum(n for ptr, n in tables.items() if ptr not in others)


def served_weight_bytes(executor: Executor) -> int:
    """The target's weights plus those of its proposer's modules (a draft model, EAGLE / Medusa heads), as far as
    this process holds them (tensor-parallel workers' shards are not counted)."""
    return module_bytes(*_served_modules(executor))
