"""UniProcExecutor: one model runner in this process (tensor_parallel_size 1, or one tensor-parallel rank).

Process-wide settings (torch's thread count, glibc malloc tuning, building the native CPU kernels) happen here,
once, at start-up, in the process that runs the model: nothing else in the engine touches global state.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from cinq.compilation_config import CompilationConfig
from cinq.config import EngineConfig
from cinq.distributed.parallel_state import TPShard
from cinq.engine.kv_cache_virtual import VirtualKVSpec
from cinq.engine.runner import ModelRunner
from cinq.engine.weight_arena import PackedWeights, pack_weights
from cinq.host_memory import keep_freed_memory
from cinq.kernels.backends import default_backend_name
from cinq.kernels.cpu_native import warm_native_kernels
from cinq.model.config import ModelConfig
from cinq.model.llama import LlamaForCausalLM
from cinq.model.loader import load_model, parse_dtype
from cinq.spec.proposer import Proposer
from cinq.spec.proposer_loader import load_proposer
from cinq.step.runner_output import RunnerOutput
from cinq.step.scheduler_output import SchedulerOutput

log = logging.getLogger(__name__)


class UniProcExecutor:
    """One model runner in this process (``tensor_parallel_size == 1``, or one rank's shard: ``shard``)."""

    def __init__(self, config: EngineConfig, seed: int | None = None, shard: TPShard | None = None) -> None:
        self.config = config
        # the engine's resolved seed (EngineConfig.seed None: it draws one); 0 for an executor built alone
        self.seed = seed if seed is not None else config.seed or 0
        self.device = torch.device(config.device)
        if shard is not None and self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", shard.rank)  # one GPU per rank
        if shard is not None and self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # NCCL's collectives run on the current device
        self.dtype = parse_dtype(config.dtype)
        self._init_device()
        self.attention_backend = config.attention_backend or (
            "contiguous" if config.kv_cache_layout == "virtual" else default_backend_name(self.device))
        self.model: LlamaForCausalLM = load_model(config.model, self.dtype, self.device, self.attention_backend,
                                                  shard)
        self.model_config: ModelConfig = self.model.config
        # a draft model or heads (speculative decoding) runs next to the target, over its block tables
        self.proposer: Proposer | None = load_proposer(config.speculative_config, config.model, self.model,
                                                       self.dtype, self.device, self.attention_backend, self.seed)
        # the weights every decode step streams, in 2 MB pages (before any program or compile holds a tensor);
        # with the proposer's modules, so the weights a head shares with its target are packed once
        self.packed_weights: PackedWeights | None = (
            pack_weights(self.model, *_modules_of(self.proposer)) if self.device.type == "cpu" else None)
        self.runner: ModelRunner | None = None

    def _init_device(self) -> None:
        if self.config.num_threads:
            # torch's intra-op pool is per process: an engine asked for N threads sets it for everyone.
            torch.set_num_threads(self.config.num_threads)
            log.info("torch threads set to %d (process-wide)", self.config.num_threads)
        if self.device.type == "cpu":
            keep_freed_memory()
            warm_native_kernels()  # build them now (once per machine) rather than stall the first request

    def kv_bytes_per_block(self, block_size: int) -> int:
        """Bytes one KV block takes over all layers (K and V), the proposer's own layers included."""
        extra = self.proposer.kv_bytes_per_block(block_size) if self.proposer is not None else 0
        return ModelRunner.kv_bytes_per_block(self.model, block_size, self.dtype) + extra

    def initialize_cache(self, num_blocks: int | tuple[int, int], virtual: VirtualKVSpec | None = None) -> None:
        """Allocate ``num_blocks`` KV blocks and the runner that owns them; with ``virtual``, reserve its slots
        instead (kv_cache_layout "virtual": ``num_blocks`` slots of ``virtual.slot_tokens``, always eager)."""
        compilation = self._compilation() if virtual is None else None
        block_size = self.config.block_size if virtual is None else virtual.slot_tokens
        self.runner = ModelRunner(self.model, num_blocks, block_size, self.device, self.dtype,
                                  seed=self.seed, proposer=self.proposer, compilation=compilation, virtual=virtual,
                                  tokenizer_path=str(self.config.model))
        if self.runner.compiled is not None:
            times = self.runner.compiled.compile_all()
            if not times:
                log.warning("compiling (capturing) the decode step failed for every size; decode runs eager")
                return
            how = ("captured the decode step (CUDA graphs)" if self.runner.compiled.graphs else
                   f"compiled the decode step (torch.compile, backend {compilation.backend})")
            log.warning("%s for batch sizes %s in %.1f s (%s)%s", how, sorted(times), sum(times.values()),
                        ", ".join(f"{n}: {t:.1f} s" for n, t in sorted(times.items())),
                        f"; sizes {sorted(self.runner.compiled.failed)} run eager" if self.runner.compiled.failed
                        else "")

    def _compilation(self) -> CompilationConfig | None:
        """The compilation config the runner gets, its sizes capped at max_num_seqs; None when eager: the default,
        --enforce-eager, or what the compiled step does not cover (a device other than the CPU, compiled, and CUDA,
        captured; a runner-side proposer; tensor parallelism)."""
        cc = self.config.compilation_config
        if not self.config.compiles_decode or cc is None:
            return None
        if self.device.type not in ("cpu", "cuda"):
            log.warning("compilation_config: the decode step is compiled on the CPU, captured on CUDA; %s runs eager",
                        self.device)
            return None
        if self.proposer is not None or self.config.tensor_parallel_size > 1:
            # a proposer needs the target's hidden states; tensor parallelism's collectives run in forward hooks
            log.warning("compilation_config: %s runs eager", "tensor parallelism" if self.proposer is None else
                        "speculative decoding with a runner-side proposer")
            return None
        def capped(sizes: list[int]) -> list[int]:
            return [n for n in sizes if n <= self.config.max_num_seqs] or sizes[:1]
        return dataclasses.replace(cc, compile_sizes=capped(cc.compile_sizes),
                                   cudagraph_capture_sizes=capped(cc.capture_sizes))

    def execute_model(self, sched: SchedulerOutput) -> RunnerOutput:
        """Run one step (also for an empty one: it still drops finished requests' runner state)."""
        if self.runner is None:
            raise RuntimeError("executor: initialize_cache must run before the first step")
        return self.runner.execute(sched)

    def shutdown(self) -> None:
        self.runner = None


def _modules_of(proposer: Proposer | None) -> list[torch.nn.Module]:
    """The modules a proposer runs (an EAGLE head, a draft model, Medusa heads): its attributes that are modules."""
    return [v for v in vars(proposer).values() if isinstance(v, torch.nn.Module)] if proposer is not None else []
