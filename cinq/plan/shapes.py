"""A model's shape for planning: a known released model by name, a config.json file, or a model folder (an
embedded model's name included), always as cinq's own ``ModelConfig`` so that planning and loading read one
parser.

The known shapes are the released ``config.json`` numbers of each model (only the fields the plan reads:
layers, hidden, heads, KV heads, head_dim, intermediate, vocabulary, tied embeddings, context). No weights are
needed or fetched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cinq.errors import InvalidParameterError
from cinq.model.config import ModelConfig


def _llama(vocab: int, hidden: int, inter: int, layers: int, heads: int, kv: int, ctx: int,
           arch: str = "LlamaForCausalLM", tied: bool = False, head_dim: int | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {"architectures": [arch], "vocab_size": vocab, "hidden_size": hidden,
                           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
                           "num_key_value_heads": kv, "max_position_embeddings": ctx, "tie_word_embeddings": tied,
                           "torch_dtype": "bfloat16"}
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    return cfg


# name -> config.json fields, as released (Hugging Face model repositories of the same name).
KNOWN_SHAPES: dict[str, dict[str, Any]] = {
    "Llama-2-7B": _llama(32000, 4096, 11008, 32, 32, 32, 4096),
    "Llama-3-8B": _llama(128256, 4096, 14336, 32, 32, 8, 8192),
    "Llama-3-70B": _llama(128256, 8192, 28672, 80, 64, 8, 8192),
    "Llama-3.1-8B": _llama(128256, 4096, 14336, 32, 32, 8, 131072),
    "Llama-3.1-70B": _llama(128256, 8192, 28672, 80, 64, 8, 131072),
    "Llama-3.1-405B": _llama(128256, 16384, 53248, 126, 128, 8, 131072),
    "Mistral-7B-v0.3": _llama(32768, 4096, 14336, 32, 32, 8, 32768, arch="MistralForCausalLM"),
    "Qwen2.5-0.5B": _llama(151936, 896, 4864, 24, 14, 2, 32768, arch="Qwen2ForCausalLM", tied=True),
    "Qwen2.5-7B": _llama(152064, 3584, 18944, 28, 28, 4, 32768, arch="Qwen2ForCausalLM"),
    "Qwen2.5-72B": _llama(152064, 8192, 29568, 80, 64, 8, 32768, arch="Qwen2ForCausalLM"),
    "Qwen3-8B": _llama(151936, 4096, 12288, 36, 32, 8, 40960, arch="Qwen3ForCausalLM", head_dim=128),
}
# Short names people use for the same files.
ALIASES: dict[str, str] = {"Mistral-7B": "Mistral-7B-v0.3", "Llama-3.1-8B-Instruct": "Llama-3.1-8B",
                           "Llama-3-8B-Instruct": "Llama-3-8B", "Llama-3-70B-Instruct": "Llama-3-70B",
                           "Qwen2.5-7B-Instruct": "Qwen2.5-7B"}


@dataclass(slots=True)
class ModelShape:
    """What the plan reads of a model: its name for the report and its ``ModelConfig``."""

    name: str
    config: ModelConfig


def known_shape_names() -> list[str]:
    """Names ``resolve_shape`` accepts besides files and folders (aliases included)."""
    return sorted(KNOWN_SHAPES) + sorted(ALIASES)


def known_shape(name: str) -> ModelShape | None:
    """The released shape of ``name`` (case-insensitive, an optional ``org/`` prefix ignored), or None."""
    base = name.rsplit("/", 1)[-1].lower()
    names = {k.lower(): k for k in KNOWN_SHAPES} | {k.lower(): v for k, v in ALIASES.items()}
    if base not in names:
        return None
    canonical = names[base]
    return ModelShape(canonical, ModelConfig.from_dict(KNOWN_SHAPES[canonical], source=f"shape {canonical}"))


def resolve_shape(model: str, field: str = "model") -> ModelShape:
    """``model`` as a shape: a known name, a config.json file, a model folder or an embedded model's name. Anything
    else is an InvalidParameterError naming ``field`` and listing the known names."""
    path = Path(model)
    if path.is_file() and path.name.endswith(".json"):
        from cinq.model.folder_files import read_json
        return ModelShape(path.parent.name or path.name, ModelConfig.from_dict(read_json(path), source=str(path)))
    shape = known_shape(model) if not path.exists() else None
    if shape is not None:
        return shape
    from cinq.assets import resolve_model_path
    from cinq.errors import ModelLoadError
    try:
        folder = resolve_model_path(model, field)
    except ModelLoadError as e:
        raise InvalidParameterError(f"{e} or a known shape ({', '.join(known_shape_names())})", field) from None
    return ModelShape(folder.name, ModelConfig.from_pretrained(folder))
