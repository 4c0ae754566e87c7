"""ModelConfig: the decoder's shape, read from a Hugging Face ``config.json``.

Which architectures are served, and each family's defaults (qkv bias, q/k norm), come from the registry
(cinq/model/registry.py); within a family the differences are fields here (Llama-3 rope scaling, tied
embeddings, Gemma 3's per-layer sliding window and local rope base).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cinq.errors import ModelLoadError
from cinq.model.folder_files import exists, read_json
from cinq.model.registry import ModelRegistry

LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(slots=True)
class ModelConfig:
    """Shape and numerics of a Llama-family decoder."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    sliding_window: int | None = None
    # per layer "full_attention" / "sliding_attention" (Gemma 3); None: every layer alike (sliding_window, when
    # set, then caps the whole context as before)
    layer_types: list[str] | None = None
    rope_local_theta: float | None = None  # rope base of the sliding layers (Gemma 3's rope_local_base_freq)
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (Gemma); None: head_dim
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str | None = None
    quantization_config: dict[str, Any] | None = None

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def tensor_parallel_problems(self, size: int) -> list[str]:
        """What ``size`` tensor-parallel ranks cannot split evenly (empty: it divides the model): the attention
        heads, the KV heads (unless ``size`` is a multiple of them: they are then replicated) and the MLP."""
        kv = self.num_key_value_heads
        problems = []
        if self.num_attention_heads % size:
            problems.append(f"num_attention_heads {self.num_attention_heads}")
        if kv % size and size % kv:
            problems.append(f"num_key_value_heads {kv} (nor is it a multiple of them)")
        if self.intermediate_size % size:
            problems.append(f"intermediate_size {self.intermediate_size}")
        return problems

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of layer ``layer`` (None: it sees its whole context)."""
        if self.layer_types is None or self.layer_types[layer] != "sliding_attention":
            return None
        return self.sliding_window

    @property
    def has_local_layers(self) -> bool:
        """Some layers only see a window (per-layer types): the context is not capped at the window."""
        return self.layer_types is not None and "sliding_attention" in self.layer_types

    @classmethod
    def from_dict(cls, cfg: dict[str, Any], source: str = "config.json") -> ModelConfig:
        """Build from a parsed HF config dict; raises ModelLoadError naming ``source``, the field and the limit."""
        if not isinstance(cfg, dict):
            raise ModelLoadError(f"{source}: must hold a JSON object, got {type(cfg).__name__}")
        fields = _Fields(cfg, source)
        archs = cfg.get("architectures") or []
        arch = ModelRegistry.resolve(archs, cfg.get("model_type"))
        if arch is None:
            found = archs or cfg.get("model_type")
            detail = f"found {found!r}" if found else "neither is set"
            raise ModelLoadError(f"{source}: no supported 'architectures' or 'model_type' ({detail}): cinq supports "
                                 f"{ModelRegistry.get_supported_archs()}")
        info = ModelRegistry.info(arch)
        default_bias, qk_norm = info.attention_bias, info.qk_norm
        sizes = {key: fields.positive_int(key, limit) for key, limit in SIZE_LIMITS.items()
                 if key not in ("num_key_value_heads", "head_dim", "max_position_embeddings")}
        heads = sizes["num_attention_heads"]
        kv_heads = fields.positive_int("num_key_value_heads", SIZE_LIMITS["num_key_value_heads"], default=heads)
        if heads % kv_heads:
            raise ModelLoadError(f"{source}: num_attention_heads ({heads}) must be a multiple of "
                                 f"num_key_value_heads ({kv_heads})")
        if cfg.get("head_dim") is None and sizes["hidden_size"] < heads:
            raise ModelLoadError(f"{source}: 'head_dim' is missing and hidden_size ({sizes['hidden_size']}) / "
                                 f"num_attention_heads ({heads}) is below 1")
        head_dim = fields.positive_int("head_dim", SIZE_LIMITS["head_dim"], default=sizes["hidden_size"] // heads)
        # transformers >= 5 writes rope_parameters (theta inside); older files use rope_theta + rope_scaling.
        rope_params = dict(fields.dict_or_none("rope_parameters") or {})
        rope_local_theta = cfg.get("rope_local_base_freq")
        if "full_attention" in rope_params:  # transformers 5 Gemma 3: one rope per layer type
            local = rope_params.pop("sliding_attention", None) or {}
            rope_params = dict(rope_params.pop("full_attention") or {})
            rope_local_theta = local.get("rope_theta", rope_local_theta)
        rope_theta = fields.positive_float("rope_theta", rope_params.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_scaling = rope_params or fields.dict_or_none("rope_scaling")
        if rope_scaling:
            rope_scaling = dict(rope_scaling)
            rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
            rope_scaling["rope_type"] = rope_type
            if rope_type == "default":
                rope_scaling = None
        act = cfg.get("hidden_act") or cfg.get("hidden_activation") or "silu"
        if act not in ("silu", "gelu", "gelu_pytorch_tanh"):
            raise ModelLoadError(f"{source}: hidden_act {act!r} is not supported (silu, gelu, gelu_pytorch_tanh)")
        # 0 and null both mean "no window" in released configs; the window only ever caps the context.
        sliding = fields.positive_int("sliding_window", 1 << 62, default=None) \
            if cfg.get("use_sliding_window", True) and cfg.get("sliding_window") != 0 else None
        torch_dtype = cfg.get("torch_dtype") or cfg.get("dtype")
        layer_types = cfg.get("layer_types")
        if layer_types is not None and (not isinstance(layer_types, list) or len(layer_types) !=
                                        sizes["num_hidden_layers"] or any(t not in LAYER_TYPES for t in layer_types)):
            raise ModelLoadError(f"{source}: 'layer_types' must list one of {list(LAYER_TYPES)} per layer "
                                 f"({sizes['num_hidden_layers']}), got {layer_types!r:.200}")
        if layer_types is not None and "sliding_attention" in layer_types and sliding is None:
            raise ModelLoadError(f"{source}: 'layer_types' has sliding_attention layers but 'sliding_window' is unset")
        scalar = cfg.get("query_pre_attn_scalar")
        return cls(
            architecture=arch,
            vocab_size=sizes["vocab_size"],
            hidden_size=sizes["hidden_size"],
            intermediate_size=sizes["intermediate_size"],
            num_hidden_layers=sizes["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=fields.positive_int(
                "max_position_embeddings", SIZE_LIMITS["max_position_embeddings"], default=2048),
            rms_norm_eps=fields.positive_float("rms_norm_eps", cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", default_bias)),
            qk_norm=qk_norm,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            hidden_act=act,
            sliding_window=sliding,
            layer_types=list(layer_types) if layer_types is not None else None,
            rope_local_theta=fields.positive_float("rope_local_base_freq", rope_local_theta)
            if rope_local_theta is not None else None,
            query_pre_attn_scalar=fields.positive_float("query_pre_attn_scalar", scalar) if scalar is not None
            else None,
            bos_token_id=fields.token_ids("bos_token_id", single=True)[0] if cfg.get("bos_token_id") is not None
            else None,
            eos_token_ids=fields.token_ids("eos_token_id"),
            torch_dtype=torch_dtype if isinstance(torch_dtype, str) else None,
            quantization_config=fields.dict_or_none("quantization_config"),
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read ``config.json`` (and eos ids from ``generation_config.json``) in a model folder; a GGUF file (or a
        folder holding one) reads the file's metadata (cinq/model/gguf/model.py)."""
        path = Path(path)
        from cinq.model.gguf.file import find_gguf_file
        gguf = find_gguf_file(path)
        if gguf is not None:
            from cinq.model.gguf.file import read_gguf
            from cinq.model.gguf.plan import gguf_model_dict
            return cls.from_dict(gguf_model_dict(read_gguf(gguf)), source=str(gguf))
        cfg_file = path / "config.json"
        if not exists(cfg_file):
            raise ModelLoadError(f"{path}: no config.json (is this a Hugging Face model folder?)")
        config = cls.from_dict(read_json(cfg_file), source=str(cfg_file))
        gen_file = path / "generation_config.json"
        if exists(gen_file):
            extra = _Fields(read_json(gen_file), str(gen_file)).token_ids("eos_token_id")
            config.eos_token_ids = list(dict.fromkeys(config.eos_token_ids + extra))
        return config


# Plausibility limits, each several times what any released model has (Llama-3.1-405B: hidden 16384,
# intermediate 53248, 126 layers, 128 heads; the largest vocabularies ~256k; contexts up to ~10M). A value past
# one is a corrupted or hostile config.json: refused before any work sized by it (building a million layers,
# allocating a 10^9-wide embedding). What fits within them is checked against memory (cinq/model/memory.py).
SIZE_LIMITS: dict[str, int] = {
    "vocab_size": 1 << 22,
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 20,
    "num_hidden_layers": 1024,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "head_dim": 1024,
    "max_position_embeddings": 1 << 24,
}

_MISSING = object()


class _Fields:
    """Typed reads of a config dict; every error names the file, the field, the value and the limit."""

    def __init__(self, cfg: dict[str, Any], source: str) -> None:
        self.cfg, self.source = cfg, source

    def positive_int(self, key: str, limit: int, default: Any = _MISSING) -> Any:
        value = self.cfg.get(key)
        if value is None:
            if default is _MISSING:
                raise ModelLoadError(f"{self.source}: '{key}' is missing (a positive integer)")
            if default is None:
                return None
            value = default
        # bool is an int in Python: "vocab_size": true is no size.
        if type(value) is not int or value <= 0:
            raise ModelLoadError(f"{self.source}: '{key}' must be a positive integer, got {value!r}")
        if value > limit:
            raise ModelLoadError(f"{self.source}: '{key}' is {value}, above the limit {limit} (far beyond any "
                                 f"released model: is the file corrupted?)")
        return value

    def positive_float(self, key: str, value: Any) -> float:
        if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
            raise ModelLoadError(f"{self.source}: '{key}' must be a positive number, got {value!r}")
        return float(value)

    def dict_or_none(self, key: str) -> dict[str, Any] | None:
        value = self.cfg.get(key)
        if value is not None and not isinstance(value, dict):
            raise ModelLoadError(f"{self.source}: '{key}' must be an object, got {type(value).__name__}")
        return value

    def token_ids(self, key: str, single: bool = False) -> list[int]:
        value = self.cfg.get(key)
        ids = [] if value is None else [value] if type(value) is int else value
        if not isinstance(ids, list) or not all(type(i) is int and 0 <= i < SIZE_LIMITS["vocab_size"] for i in ids) \
                or (single and len(ids) != 1):
            kind = "a token id" if single else "a token id or a list of token ids"
            raise ModelLoadError(f"{self.source}: '{key}' must be {kind} (integers in [0, "
                                 f"{SIZE_LIMITS['vocab_size']})), got {value!r}")
        return list(ids)
