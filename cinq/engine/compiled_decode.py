"""CompiledDecode: ``torch.compile`` of the decode step (forward + LM head) at a few fixed batch sizes, the CPU
analogue of CUDA graph capture sizes (``compilation_config``, cinq/compilation_config.py).

A decode-only step of n one-token sequences runs the compiled step of the smallest compile size >= n: the batch
is padded with one-token sequences on the runner's scratch blocks and its block tables to a fixed width, so every
step of a size has the same shapes and one compiled graph serves it (``dynamic=False``: no shape guards to
miss). Everything else (prefill chunks, mixed steps, speculative verifies, larger batches) runs eager. The native
CPU kernels enter the graph as the torch custom ops of cinq/kernels/custom_ops.py.

Each size is compiled at start-up (``compile_all``, run by the executor like vLLM's capture): the first call of a
size compiles it, and its time is logged and kept in ``compile_times_s``. A size that fails to compile is left
to eager, said once in the log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from cinq.compilation_config import CompilationConfig
from cinq.engine.batch_inputs import BatchInputs, build_batch
from cinq.engine.io import ScheduledSeq
from cinq.kernels import custom_ops  # noqa: F401  (registers torch.ops.cinq.*, which the traced kernels call)
from cinq.kernels.cpu_native import warm_native_kernels
from cinq.kernels.metadata import AttentionMetadata
from cinq.model.llama import LlamaForCausalLM

log = logging.getLogger(__name__)
_RECOMPILE_LIMIT = 64  # dynamo keeps one graph per (model, size) on the step's code object; 8 by default


class CompiledDecode:
    """The compiled decode step of one model runner (its block size, scratch blocks for the padding, device):
    ``run(seqs)`` for a step's sequences."""

    def __init__(self, model: LlamaForCausalLM, config: CompilationConfig, block_size: int, pad_block_ids: list[int],
                 device: torch.device, table_width: int) -> None:
        self.model = model
        self.config = config
        self.block_size = block_size
        self.pad_block_ids = pad_block_ids
        self.device = device
        self.table_width = table_width
        self.compile_times_s: dict[int, float] = {}
        self.failed: set[int] = set()
        self.steps = 0  # decode steps run compiled (tests check the path is taken)
        warm_native_kernels()  # loaded and probed before any trace: dynamo cannot call into the extensions
        if torch._dynamo.config.recompile_limit < _RECOMPILE_LIMIT:  # process-wide: raised, never lowered
            torch._dynamo.config.recompile_limit = _RECOMPILE_LIMIT

        def step(input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
            return model.compute_logits(model(input_ids, positions, meta))

        # inductor computes fused bf16 element-wise ops in float32 and rounds once; emulating eager's rounding of
        # every intermediate keeps the compiled step's tokens those of the eager step
        options = {"emulate_precision_casts": True} if config.backend == "inductor" else None
        self._step: Callable[..., torch.Tensor] = torch.compile(step, backend=config.backend, fullgraph=True,
                                                                dynamic=False, options=options)

    def run(self, seqs: list[ScheduledSeq]) -> tuple[BatchInputs, torch.Tensor] | None:
        """The step's batch (its sequences in row order) and the float32 logits of its rows (padding rows last),
        or None when the step is not a plain decode of a compile size (or that size failed to compile): the
        caller runs it eager."""
        size = self.size_for(seqs)
        if size is None:
            return None
        batch = self._batch(seqs, size)
        logits = self.logits(batch, size)
        return None if logits is None else (batch, logits)

    def compile_all(self) -> dict[int, float]:
        """Compile every compile size now, on dummy steps over the scratch blocks (as vLLM captures CUDA graphs at
        start-up); returns the seconds each took (sizes that failed run eager)."""
        with torch.inference_mode():
            for size in self.config.compile_sizes:
                batch = self._batch([], size)
                # one eager step first fills the model's lazy caches (rope tables): traced empty, they would be
                # guards that the first real step fails, a recompile
                self.model(batch.input_ids, batch.positions, batch.meta)
                self.logits(batch, size)
        self.steps = 0
        return dict(self.compile_times_s)

    def _batch(self, seqs: list[ScheduledSeq], size: int) -> BatchInputs:
        return build_batch(seqs, self.block_size, self.pad_block_ids, self.device, decode_batch=size,
                           table_width=self.table_width)

    def size_for(self, seqs: list[ScheduledSeq]) -> int | None:
        """The compiled batch size this step runs at, or None (eager): only steps of plain one-token decodes."""
        if any(len(s.token_ids) != 1 or s.num_logit_rows != 1 or s.num_draft_slots for s in seqs):
            return None
        size = self.config.padded_size(len(seqs))
        return None if size is None or size in self.failed else size

    def logits(self, batch: BatchInputs, size: int) -> torch.Tensor | None:
        """Float32 logits of every row of ``batch`` (``size`` rows, padding last), or None when this size could
        not be compiled (the caller runs the step eager)."""
        if size not in self.compile_times_s:
            return self._first_call(batch, size)
        self.steps += 1
        return self._step(batch.input_ids, batch.positions, batch.meta)

    def _first_call(self, batch: BatchInputs, size: int) -> torch.Tensor | None:
        t0 = time.perf_counter()
        try:
            out = self._step(batch.input_ids, batch.positions, batch.meta)
        except Exception as e:  # noqa: BLE001 - any compile failure leaves this size to eager
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            log.warning("torch.compile of the decode step at batch size %d failed (%s); it runs eager", size, first)
            self.failed.add(size)
            return None
        self.compile_times_s[size] = time.perf_counter() - t0
        self.steps += 1
        return out
