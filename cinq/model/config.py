"""ModelConfig: the decoder's shape, read from a Hugging Face ``config.json``.

One decoder covers Llama (with Llama-3 rope scaling), Mistral, Qwen2 and Qwen3; the differences between them
are fields here (qkv bias, q/k norm, tied embeddings), never separate model classes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cinq.errors import ModelLoadError

# architecture name in config.json -> (qkv bias by default, q/k RMSNorm)
SUPPORTED_ARCHITECTURES: dict[str, tuple[bool, bool]] = {
    "LlamaForCausalLM": (False, False),
    "MistralForCausalLM": (False, False),
    "Qwen2ForCausalLM": (True, False),
    "Qwen3ForCausalLM": (False, True),
}


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

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        """Build from a parsed HF config dict; raises ModelLoadError naming what is wrong."""
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            model_type = cfg.get("model_type", "")
            by_type = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                       "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
            arch = by_type.get(model_type)
        if arch is None:
            raise ModelLoadError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}: "
                f"cinq supports {sorted(SUPPORTED_ARCHITECTURES)}")
        default_bias, qk_norm = SUPPORTED_ARCHITECTURES[arch]
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads"):
            if not isinstance(cfg.get(key), int) or cfg[key] <= 0:
                raise ModelLoadError(f"config.json: '{key}' must be a positive integer, got {cfg.get(key)!r}")
        heads = cfg["num_attention_heads"]
        kv_heads = cfg.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise ModelLoadError(
                f"config.json: num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})")
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        # transformers >= 5 writes rope_parameters (theta inside); older files use rope_theta + rope_scaling.
        rope_params = dict(cfg.get("rope_parameters") or {})
        rope_theta = float(rope_params.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_scaling = rope_params or cfg.get("rope_scaling")
        if rope_scaling:
            rope_scaling = dict(rope_scaling)
            rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
            rope_scaling["rope_type"] = rope_type
            if rope_type == "default":
                rope_scaling = None
        eos = cfg.get("eos_token_id")
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        act = cfg.get("hidden_act", "silu")
        if act not in ("silu", "gelu", "gelu_pytorch_tanh"):
            raise ModelLoadError(f"config.json: hidden_act {act!r} is not supported (silu, gelu, gelu_pytorch_tanh)")
        sliding = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", default_bias)),
            qk_norm=qk_norm,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            hidden_act=act,
            sliding_window=sliding,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            quantization_config=cfg.get("quantization_config"),
        )

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read ``config.json`` (and eos ids from ``generation_config.json``) in a model folder."""
        path = Path(path)
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise ModelLoadError(f"{path}: no config.json (is this a Hugging Face model folder?)")
        try:
            cfg = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as e:
            raise ModelLoadError(f"{cfg_file}: invalid JSON: {e}") from e
        config = cls.from_dict(cfg)
        gen_file = path / "generation_config.json"
        if gen_file.is_file():
            gen = json.loads(gen_file.read_text())
            eos = gen.get("eos_token_id")
            if eos is not None:
                extra = [eos] if isinstance(eos, int) else list(eos)
                config.eos_token_ids = list(dict.fromkeys(config.eos_token_ids + extra))
        return config
