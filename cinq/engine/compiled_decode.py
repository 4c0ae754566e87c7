"""CompiledDecode: the decode step (forward + LM head) at a few fixed batch sizes, run over persistent inputs
(cinq/engine/step_buffers.py) and either compiled with ``torch.compile`` (the CPU) or captured as a CUDA graph
(cinq/engine/cuda_graph.py), vLLM's ``compile_sizes`` / ``cudagraph_capture_sizes`` (cinq/compilation_config.py).

A decode-only step of n one-token sequences runs at the smallest size >= n: its inputs are written in place into
that size's buffers (padding rows on the runner's scratch block, tables a fixed width), so every step of a size
has the same shapes and the same tensors, and one compiled graph (``dynamic=False``: no shape guards to miss) or
one CUDA graph serves it. Everything else (prefill chunks, mixed steps, speculative verifies, larger batches) runs
eager. The native CPU kernels enter the compiled graph as the C++-registered ops of cinq/kernels/custom_ops.py.

Each size is compiled (or captured) at start-up (``compile_all``, run by the executor like vLLM's capture); its
time is logged and kept in ``compile_times_s``. inductor's compiled code is cached on disk under the cinq cache dir
(``inductor_cache_dir``: its keys cover the graph, hence the model's shapes and the size, and the torch version),
so a second start pays tracing, not the C++ compiler. A size that fails is left to eager, said once in the log.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from cinq.cache import cache_dir
from cinq.compilation_config import CompilationConfig
from cinq.engine.cuda_graph import CudaGraphStep
from cinq.engine.step_buffers import StepBuffers
from cinq.kernels import custom_ops  # noqa: F401  (registers torch.ops.cinq.*, which the traced kernels call)
from cinq.kernels.cpu_native import warm_native_kernels
from cinq.model.decode_layers import set_fused_decode
from cinq.model.llama import LlamaForCausalLM
from cinq.step.scheduler_output import ScheduledSeq

log = logging.getLogger(__name__)
_RECOMPILE_LIMIT = 64  # dynamo keeps one graph per (model, size) on the step's code object; 8 by default


def inductor_cache_dir() -> Path:
    """Where inductor keeps its compiled graphs for cinq: $TORCHINDUCTOR_CACHE_DIR when the user set one, else
    one folder per torch version under the cinq cache dir (set for this process on first use)."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor" / f"torch-{torch.__version__}")
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


class CompiledDecode:
    """The compiled (CPU) or captured (CUDA) decode step of one model runner: ``run(seqs)`` for a step's
    sequences."""

    def __init__(self, model: LlamaForCausalLM, config: CompilationConfig, block_size: int, pad_block_ids: list[int],
                 device: torch.device, table_width: int) -> None:
        self.model = model
        self.config = config
        self.device = device
        self.graphs = device.type == "cuda"
        sizes = config.capture_sizes if self.graphs else config.compile_sizes
        self.buffers = {n: StepBuffers.allocate(n, block_size, table_width, pad_block_ids[0], device)
                        for n in sizes}
        self.compile_times_s: dict[int, float] = {}
        self.failed: set[int] = set()
        self.steps = 0  # decode steps run compiled / captured (tests check the path is taken)
        self._captured: dict[int, CudaGraphStep] = {}
        if self.graphs:
            self._step: Callable[..., torch.Tensor] = self._eager_step
            return
        warm_native_kernels()  # loaded and probed before any trace: dynamo cannot call into the extensions
        if torch._dynamo.config.recompile_limit < _RECOMPILE_LIMIT:  # process-wide: raised, never lowered
            torch._dynamo.config.recompile_limit = _RECOMPILE_LIMIT
        options = None
        if config.backend == "inductor":
            inductor_cache_dir()
            # inductor computes fused bf16 element-wise ops in float32 and rounds once; emulating eager's rounding
            # of every intermediate keeps the compiled step's tokens those of the eager step
            options = {"emulate_precision_casts": True, **config.inductor_compile_config}
        self._step = torch.compile(self._eager_step, backend=config.backend, fullgraph=True, dynamic=False,
                                   options=options)

    def _eager_step(self, input_ids: torch.Tensor, positions: torch.Tensor, meta) -> torch.Tensor:  # noqa: ANN001
        return self.model.compute_logits(self.model(input_ids, positions, meta))

    def run(self, seqs: list[ScheduledSeq]) -> torch.Tensor | None:
        """The float32 logits of ``seqs`` (rows in their order), or None when the step is not a plain decode of a
        compiled size (or that size failed): the caller runs it eager. On CUDA the rows are a view of the graph's
        static output, valid until the next step."""
        size = self.size_for(seqs)
        if size is None:
            return None
        self.buffers[size].fill(seqs)
        logits = self.logits(size)
        return None if logits is None else logits[:len(seqs)]

    def compile_all(self) -> dict[int, float]:
        """Compile (or capture) every size now, on dummy steps of padding rows (as vLLM captures CUDA graphs at
        start-up, largest first so that the smaller graphs share its memory pool); returns the seconds each took
        (sizes that failed run eager)."""
        with torch.inference_mode():
            for size in sorted(self.buffers, reverse=True):
                buffers = self.buffers[size]
                buffers.fill([])
                # one eager step first fills the model's lazy caches (every layer's rope table): traced empty, they
                # would be guards that the first real step fails (a recompile), or tables the compiled graph builds
                # on every step. It runs the Python layers: the fused step reads one table for the whole stack, and
                # left the others empty (SmolLM2's compiled step spent 27% of its time in sin / cos)
                set_fused_decode(self.model, False)
                try:
                    self._eager_step(buffers.input_ids, buffers.positions, buffers.meta)
                finally:
                    set_fused_decode(self.model, True)
                self.logits(size)
        self.steps = 0
        return dict(self.compile_times_s)

    def size_for(self, seqs: list[ScheduledSeq]) -> int | None:
        """The batch size this step runs at, or None (eager): only steps of plain one-token decodes."""
        if any(len(s.token_ids) != 1 or s.num_logit_rows != 1 or s.num_draft_slots for s in seqs):
            return None
        size = next((n for n in self.buffers if n >= len(seqs)), None)
        return None if size is None or size in self.failed else size

    def logits(self, size: int) -> torch.Tensor | None:
        """Float32 logits of every row of ``size``'s buffers as filled (padding last), or None when this size
        could not be compiled (the caller runs the step eager)."""
        if size not in self.compile_times_s:
            return self._first_call(size)
        self.steps += 1
        return self._call(size)

    def _call(self, size: int) -> torch.Tensor:
        if self.graphs:
            return self._captured[size].replay()
        b = self.buffers[size]
        if size not in self.compile_times_s:  # its first call compiles: every guard is built and checked
            return self._step(b.input_ids, b.positions, b.meta)
        # Later calls check only the guards that tell the sizes' graphs apart (their shapes): the model, its
        # weights and caches and the buffers are the same objects every step, and evaluating every guard on them
        # costs more than the rest of the compiled code's host work (0.23 ms a step on cinq-tiny)
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            return self._step(b.input_ids, b.positions, b.meta)

    def _first_call(self, size: int) -> torch.Tensor | None:
        t0 = time.perf_counter()
        try:
            if self.graphs:
                b = self.buffers[size]
                pool = next(iter(self._captured.values())).pool() if self._captured else None
                self._captured[size] = CudaGraphStep(lambda s: self._eager_step(s.input_ids, s.positions, s.meta),
                                                     b, pool)
            out = self._call(size)
        except Exception as e:  # noqa: BLE001 - any compile / capture failure leaves this size to eager
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            log.warning("%s of the decode step at batch size %d failed (%s); it runs eager",
                        "CUDA graph capture" if self.graphs else "torch.compile", size, first)
            self.failed.add(size)
            return None
        self.compile_times_s[size] = time.perf_counter() - t0
        self.steps += 1
        return out
