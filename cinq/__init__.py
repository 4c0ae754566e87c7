"""cinq: cheap LLM inference — an engine with a paged KV cache and continuous batching, flash attention kernels,
weight quantization (RTN, GPTQ, AWQ, SmoothQuant, NF4, FP8) and speculative decoding (n-gram lookup, a draft
model, EAGLE / EAGLE-3 and Medusa heads), plus the training and distillation of the small models it serves.

Importing cinq sets nothing process-wide: a program that wants cinq's OpenMP setting calls
``cinq.process_env.set_omp_wait_policy()`` before importing torch (the ``cinq`` command does).
"""

from cinq.config import EngineConfig
from cinq.outputs import CompletionOutput, Logprob, RequestOutput
from cinq.sampling_params import SamplingParams
from cinq.structured.params import StructuredOutputsParams

__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "BeamSearchParams", "StructuredOutputsParams",
           "RequestOutput", "CompletionOutput", "Logprob"]
__version__ = "0.1.0"


def __getattr__(name: str) -> type:
    # The engine pulls in torch and the model code: import it only when asked for.
    if name == "LLM":
        from cinq.engine.llm import LLM
        return LLM
    if name == "BeamSearchParams":
        from cinq.engine.beam_search import BeamSearchParams
        return BeamSearchParams
    if name == "LLMEngine":
        from cinq.engine.engine import LLMEngine
        return LLMEngine
    raise AttributeError(name)
