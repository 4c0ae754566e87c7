"""cinq: cheap LLM inference — paged KV cache with continuous batching, flash attention kernels, quantization,
speculative decoding and distillation in one engine."""

import os

# Set before torch loads OpenMP (it reads this once): spinning worker threads make every parallel op many times
# slower whenever the cores are shared with other processes (measured 4-25x on a busy 2-core machine), while
# sleeping ones cost a few microseconds per op on an idle one. A value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from cinq.config import EngineConfig  # noqa: E402
from cinq.outputs import CompletionOutput, Logprob, RequestOutput  # noqa: E402
from cinq.sampling_params import SamplingParams  # noqa: E402

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # The engine pulls in torch and the model code: import it only when asked for.
    if name == "LLM":
        from cinq.engine.llm import LLM
        return LLM
    if name == "LLMEngine":
        from cinq.engine.engine import LLMEngine
        return LLMEngine
    raise AttributeError(name)
