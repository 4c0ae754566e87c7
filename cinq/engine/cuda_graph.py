"""CudaGraphStep: one CUDA graph of a decode step (forward + LM head) at a fixed batch size, captured over that
size's StepBuffers (cinq/engine/step_buffers.py) and replayed after each ``fill``.

A graph replays the kernels it captured with the arguments they had: every input must live at the same address
(the persistent buffers), and no launch may size its grid from a host value of the step. The Triton decode
kernel sizes its split-K grid from the longest context, so the capture describes every row as ``capacity`` long
(``seq_lens_cpu``, host only): the grid then covers any context the tables can hold, and programs past a row's
real length (read from the device's ``seq_lens``) find no key and are merged away. Prefill and mixed steps stay
eager, as in vLLM's piecewise default.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from cinq.engine.step_buffers import StepBuffers

_WARMUP_STEPS = 2  # eager runs before capture: lazy caches (rope tables), Triton autotuning and JIT happen there


class CudaGraphStep:
    """``step(buffers)`` captured on the current CUDA device; ``replay()`` returns its (static) output tensor,
    valid until the next replay."""

    def __init__(self, step: Callable[[StepBuffers], torch.Tensor], buffers: StepBuffers,
                 pool: tuple[int, int] | None = None) -> None:
        meta = buffers.meta
        real_lens, real_max = list(meta.seq_lens_cpu), meta.max_seq_len
        meta.seq_lens_cpu[:] = [buffers.capacity] * buffers.size  # grids sized for the longest possible context
        meta.max_seq_len = buffers.capacity
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(_WARMUP_STEPS):
                    step(buffers)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool):
                self.output = step(buffers)
        finally:
            meta.seq_lens_cpu[:], meta.max_seq_len = real_lens, real_max

    def pool(self) -> tuple[int, int]:
        """The graph's memory pool: later captures share it (vLLM captures the largest size first for this)."""
        return self.graph.pool()

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.output
