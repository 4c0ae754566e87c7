"""EngineConfig: everything that shapes an engine, validated on construction.

Errors are ``InvalidParameterError``s naming the field and its allowed range, so the CLI and the server can
report them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from cinq.errors import InvalidParameterError


@dataclass(slots=True)
class EngineConfig:
    """Engine settings (model, cache, scheduler). Field names follow vLLM's engine arguments."""

    model: str = ""
    tokenizer: str | None = None  # defaults to the model folder
    dtype: str = "bfloat16"  # float32 for parity tests; bf16 is the fast path on CPU
    device: str = "cpu"
    max_model_len: int | None = None  # default: max_position_embeddings from config.json
    block_size: int = 16
    kv_cache_memory: float | None = None  # GiB for the KV cache; default: kv_cache_memory_fraction of free memory
    kv_cache_memory_fraction: float = 0.2
    num_kv_blocks: int | None = None  # exact block count (tests); overrides the memory budget
    max_num_batched_tokens: int = 2048  # token budget per step (decodes + prefill chunks)
    max_num_seqs: int = 128  # running requests per step
    enable_prefix_caching: bool = True
    attention_backend: str | None = None  # None: "triton" on CUDA, "sdpa" on CPU
    seed: int = 0
    num_threads: int | None = None  # torch intra-op threads on CPU; None leaves torch's default
    extra: dict[str, object] = field(default_factory=dict)  # room for later features' switches

    def __post_init__(self) -> None:
        if not isinstance(self.model, str):
            raise InvalidParameterError(f"model must be a path string, got {type(self.model).__name__}", "model")
        if self.dtype not in ("bfloat16", "bf16", "float32", "fp32", "float16", "fp16"):
            raise InvalidParameterError(
                f"dtype must be one of bfloat16, float32, float16; got {self.dtype!r}", "dtype")
        _check_int(self, "block_size", 1, 1024)
        if self.block_size & (self.block_size - 1):
            raise InvalidParameterError(f"block_size must be a power of two, got {self.block_size}", "block_size")
        _check_int(self, "max_num_batched_tokens", 1, 1 << 20)
        _check_int(self, "max_num_seqs", 1, 1 << 16)
        if self.max_model_len is not None:
            _check_int(self, "max_model_len", 1, 1 << 24)
        if self.num_kv_blocks is not None:
            _check_int(self, "num_kv_blocks", 1, 1 << 24)
        if self.num_threads is not None:
            _check_int(self, "num_threads", 1, 4096)
        if self.kv_cache_memory is not None and not (0 < float(self.kv_cache_memory) <= 4096):
            raise InvalidParameterError(
                f"kv_cache_memory must be in (0, 4096] GiB, got {self.kv_cache_memory}", "kv_cache_memory")
        if not (0 < float(self.kv_cache_memory_fraction) <= 0.95):
            raise InvalidParameterError(
                f"kv_cache_memory_fraction must be in (0, 0.95], got {self.kv_cache_memory_fraction}",
                "kv_cache_memory_fraction")

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: object) -> EngineConfig:
        """Build from keyword engine arguments (as ``LLM(model, **kwargs)``); unknown names are errors."""
        unknown = sorted(set(kwargs) - cls.field_names())
        if unknown:
            raise InvalidParameterError(
                f"unknown engine argument(s) {unknown}; known: {sorted(cls.field_names() - {'extra'})}",
                unknown[0])
        return cls(model=model, **kwargs)  # type: ignore[arg-type]


def _check_int(cfg: EngineConfig, name: str, lo: int, hi: int) -> None:
    value = getattr(cfg, name)
    if not isinstance(value, int) or isinstance(value, bool) or not (lo <= value <= hi):
        raise InvalidParameterError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}", name)
