"""cinq: cheap LLM inference — paged KV cache with continuous batching, flash attention kernels, quantization,
speculative decoding and distillation in one engine."""

from cinq.config import EngineConfig
from cinq.outputs import CompletionOutput, Logprob, RequestOutput
from cinq.sampling_params import SamplingParams

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
