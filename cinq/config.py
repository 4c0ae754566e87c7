"""EngineConfig: everything that shapes an engine, validated on construction.

Errors are ``InvalidParameterError``s naming the field and its allowed range, so the CLI and the server can
report them as they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from cinq.compilation_config import CompilationConfig
from cinq.errors import InvalidParameterError
from cinq.spec.config import BUILT_METHODS, SpeculativeConfig

DTYPES = ("bfloat16", "float32", "float16")
KV_CACHE_LAYOUTS = ("paged", "virtual")
_DTYPE_ALIASES = ("bf16", "fp32", "fp16")


def json_object(text: str) -> dict[str, Any]:
    """A command-line JSON object (``--speculative-config '{...}'``)."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def resolve_model(name: str | Path | None, field: str = "model") -> str:
    """A model argument as the folder to load. An existing folder is taken as it is: the loader vets its files
    and names a bad one (a FIFO or /dev/zero link named config.json included). Anything else goes through
    ``cinq.assets.resolve_model_path``: None or "" is the default model, an embedded model's name its shipped
    folder, and the rest one ModelLoadError line naming ``field``."""
    if name and Path(name).is_dir():
        return str(name)
    from cinq.assets import resolve_model_path
    return str(resolve_model_path(name or None, field))


def _arg(default: object, help_text: str, **metadata: object) -> Any:
    """A field with its command-line help kept next to it (argparse text: ``%(default)s`` expands), and optionally
    ``choices``, a ``flag`` spelling other than ``--field-name``, or a ``parse`` function for the flag's text:
    ``cinq.commands.engine_args`` derives every engine flag from these."""
    return field(default=default, metadata={"help": help_text, **metadata})


@dataclass(slots=True)
class ParallelConfig:
    """How one engine spreads the model over devices (tensor parallelism only, so far)."""

    tensor_parallel_size: int = 1
    # Whole engine replicas behind one front end (cinq.dp, on Ray; `cinq serve --data-parallel-size`); as in
    # vLLM, not part of world_size: each replica is its own engine of world_size devices.
    data_parallel_size: int = 1

    def __post_init__(self) -> None:
        _check_int(self, "tensor_parallel_size", 1, 4096)
        _check_int(self, "data_parallel_size", 1, 1024)

    @property
    def world_size(self) -> int:
        """Devices (processes) one engine uses: the product of every parallel degree (only tensor parallel yet)."""
        return self.tensor_parallel_size


@dataclass(slots=True)
class EngineConfig:
    """Engine settings (model, cache, scheduler). Field names follow vLLM's engine arguments."""

    # "" (LLM(None)) is the default model; the engine resolves names with resolve_model, so a bad one is the
    # same one-line error naming "model" wherever it comes from
    model: str = _arg("", "Hugging Face model folder (config.json + safetensors + tokenizer.json) or the name of "
                          "an embedded model (cinq-tiny, cinq-tiny-student)")
    tokenizer: str | None = _arg(None, "tokenizer folder (default: the model folder)")
    chat_template: str | None = _arg(
        None, "chat template (jinja2) in place of the tokenizer's: a file's path or the template inline (as vLLM)")
    # float32 for parity tests; bf16 is the fast path on CPU
    dtype: str = _arg("bfloat16", "compute dtype (default %(default)s; float32 for exact parity)", choices=DTYPES)
    device: str = _arg("cpu", "torch device (default %(default)s)")
    max_model_len: int | None = _arg(None, "context length (default: from config.json)")
    block_size: int = _arg(16, "KV cache block size in tokens")
    kv_cache_memory: float | None = _arg(
        None, "KV cache size in GiB (default: --kv-cache-memory-fraction of free memory)")
    kv_cache_memory_fraction: float = _arg(
        0.2, "fraction of free memory for the KV cache when --kv-cache-memory is not given")
    num_kv_blocks: int | None = _arg(None, "exact number of KV blocks (overrides memory)")  # tests use it
    max_num_batched_tokens: int = _arg(2048, "token budget per engine step (decodes + prefill chunks)")
    max_num_seqs: int = _arg(128, "max running requests per step")
    kv_cache_layout: str = _arg(
        "paged", "paged: block tables over a block pool, with prefix caching (default); virtual: vAttention, one "
                 "contiguous virtual range per request and layer, 4 KiB pages committed on first write and "
                 "returned on finish (CPU, no prefix caching, no speculative decoding or tensor parallelism)",
        choices=KV_CACHE_LAYOUTS)
    enable_prefix_caching: bool = _arg(True, "disable automatic prefix caching", flag="--no-prefix-caching")
    attention_backend: str | None = _arg(
        None, "sdpa | flash-torch | reference | triton (default: triton on CUDA, sdpa on CPU); contiguous with "
              "--kv-cache-layout virtual (its default)")
    seed: int | None = _arg(
        None, "seed of the engine's sampling generator, which requests without their own seed draw from "
              "(default: a fresh random seed per engine; give one for reproducible runs)")
    generation_config: str = _arg(
        "auto", "default sampling parameters when a request gives none: 'auto' = the model's "
                "generation_config.json (as vLLM), 'vllm' (or 'cinq') = ignore it, or a folder holding one")
    # None leaves torch's default; torch's pool is per process, so the executor sets it once at start-up
    num_threads: int | None = _arg(None, "torch CPU threads (process-wide, set at engine start-up)")
    tensor_parallel_size: int = _arg(
        1, "devices (processes) to split the model over: Megatron-style tensor parallelism, gloo on CPU, NCCL on "
           "CUDA (default %(default)s)")
    speculative_config: SpeculativeConfig | dict[str, Any] | None = _arg(
        None, "speculative decoding as vLLM's JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
              "\"prompt_lookup_max\": 3}' or '{\"method\": \"eagle\", \"model\": \"cinq-tiny-eagle\", "
              "\"num_speculative_tokens\": 3}' (ngram, draft model, eagle, eagle3, medusa)", parse=json_object)
    enforce_eager: bool = _arg(False, "never compile: run every step eager, whatever --compilation-config says")
    compilation_config: CompilationConfig | dict[str, Any] | None = _arg(
        None, "the decode step compiled (CPU: torch.compile) or captured (CUDA graphs) as vLLM's JSON, e.g. "
              "'{\"mode\": 3, \"compile_sizes\": [1, 2, 4, 8]}' (mode 0: eager, the default; backend inductor | "
              "aot_eager | eager; cudagraph_capture_sizes; inductor_compile_config, e.g. {\"cpp_wrapper\": true}); "
              "decode steps of a listed batch size (padded up to the next one) run compiled, the rest eager",
        parse=json_object)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str):
            raise InvalidParameterError(f"model must be a path string, got {type(self.model).__name__}", "model")
        if self.dtype not in DTYPES + _DTYPE_ALIASES:
            raise InvalidParameterError(
                f"dtype must be one of bfloat16, float32, float16; got {self.dtype!r}", "dtype")
        check_device_name(self.device)
        if self.chat_template is not None:  # a path that is no file is refused before any loading
            from cinq.model.chat_template import load_chat_template  # here: the kernels import this module
            load_chat_template(self.chat_template)
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
        if self.seed is not None:
            _check_int(self, "seed", 0, (1 << 63) - 2)  # the proposer's generator takes seed + 1
        if not isinstance(self.generation_config, str) or not self.generation_config:
            raise InvalidParameterError(
                f"generation_config must be 'auto', 'vllm' or a folder path, got {self.generation_config!r}",
                "generation_config")
        if self.kv_cache_memory is not None and not (0 < float(self.kv_cache_memory) <= 4096):
            raise InvalidParameterError(
                f"kv_cache_memory must be in (0, 4096] GiB, got {self.kv_cache_memory}", "kv_cache_memory")
        if not (0 < float(self.kv_cache_memory_fraction) <= 0.95):
            raise InvalidParameterError(
                f"kv_cache_memory_fraction must be in (0, 0.95], got {self.kv_cache_memory_fraction}",
                "kv_cache_memory_fraction")
        _check_int(self, "tensor_parallel_size", 1, 4096)
        _from_json_object(self, "speculative_config", SpeculativeConfig)
        _from_json_object(self, "compilation_config", CompilationConfig)
        self._check_kv_cache_layout()
        if self.speculative_config is not None and self.speculative_config.method not in BUILT_METHODS:
            raise InvalidParameterError(
                f"speculative_config.method {self.speculative_config.method!r} is not built yet (built: "
                f"{list(BUILT_METHODS)})", "method")
        if (self.tensor_parallel_size > 1 and self.speculative_config is not None
                and self.speculative_config.method != "ngram"):
            # draft models and heads run inside the runner over unsharded weights; n-gram lookup is the scheduler's
            raise InvalidParameterError(
                f"speculative_config.method {self.speculative_config.method!r} is not supported with "
                f"tensor_parallel_size {self.tensor_parallel_size} (only 'ngram' is)", "speculative_config")

    def _check_kv_cache_layout(self) -> None:
        if self.kv_cache_layout not in KV_CACHE_LAYOUTS:
            raise InvalidParameterError(
                f"kv_cache_layout must be one of {list(KV_CACHE_LAYOUTS)}, got {self.kv_cache_layout!r}",
                "kv_cache_layout")
        if self.kv_cache_layout == "paged":
            if self.attention_backend == "contiguous":
                raise InvalidParameterError(
                    "attention_backend 'contiguous' reads the virtual layout: use it with kv_cache_layout 'virtual'",
                    "attention_backend")
            return
        # the virtual layout (cinq/engine/kv_cache_virtual.py): host mmap, one contiguous range per request
        unsupported = [(self.attention_backend not in (None, "contiguous"),
                        f"attention_backend {self.attention_backend!r} (it takes 'contiguous')", "attention_backend"),
                       (not str(self.device).startswith("cpu"),
                        f"device {self.device!r} (the reservation is host memory: CPU only)", "device"),
                       (self.tensor_parallel_size > 1, "tensor_parallel_size > 1", "tensor_parallel_size"),
                       (self.speculative_config is not None, "speculative_config", "speculative_config"),
                       (self.compiles_decode, "compilation_config (the compiled decode step reads the paged cache)",
                        "compilation_config")]
        for bad, what, param in unsupported:
            if bad:
                raise InvalidParameterError(f"kv_cache_layout 'virtual' does not support {what}", param)

    @property
    def compiles_decode(self) -> bool:
        """True when decode steps are to be compiled: a compilation_config with mode > 0 and no enforce_eager."""
        return not self.enforce_eager and self.compilation_config is not None and self.compilation_config.enabled

    @property
    def parallel_config(self) -> ParallelConfig:
        """The parallel layout of this engine."""
        return ParallelConfig(tensor_parallel_size=self.tensor_parallel_size)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: object) -> EngineConfig:
        """Build from keyword engine arguments (as ``LLM(model, **kwargs)``); unknown names are errors."""
        unknown = sorted(set(kwargs) - cls.field_names())
        if unknown:
            raise InvalidParameterError(
                f"unknown engine argument(s) {unknown}; known: {sorted(cls.field_names())}", unknown[0])
        return cls(model=model, **kwargs)  # type: ignore[arg-type]


# The device types cinq's engine runs on (its kernels, executors and memory accounting know no other).
ENGINE_DEVICE_TYPES = ("cpu", "cuda")


def check_device_name(device: object) -> None:
    """A device string torch parses, of a type the engine runs on (whether this machine has it is the engine's
    start-up, or the CLI's ``--device`` check, to say: a Ray replica's device is on another machine)."""
    import torch
    try:
        dev = torch.device(device)  # type: ignore[arg-type]
    except (RuntimeError, TypeError, ValueError):
        raise InvalidParameterError(f"device {device}: not a device torch knows (cinq runs on cpu or cuda[:N])",
                                    "device") from None
    if dev.type not in ENGINE_DEVICE_TYPES:
        raise InvalidParameterError(f"device {device}: cinq's engine runs on cpu or cuda[:N], not {dev.type}",
                                    "device")


def _check_int(cfg: object, name: str, lo: int, hi: int) -> None:
    value = getattr(cfg, name)
    if not isinstance(value, int) or isinstance(value, bool) or not (lo <= value <= hi):
        raise InvalidParameterError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}", name)


def _from_json_object(cfg: object, name: str, cls: type) -> None:
    """A nested config given as a JSON object becomes ``cls`` (through ``cls.from_dict``); anything else but
    ``cls`` or None is an error naming the field."""
    value = getattr(cfg, name)
    if isinstance(value, dict):
        setattr(cfg, name, cls.from_dict(value))
    elif value is not None and not isinstance(value, cls):
        raise InvalidParameterError(f"{name} must be a JSON object, got {type(value).__name__}", name)
