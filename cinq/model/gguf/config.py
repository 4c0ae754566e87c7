"""A GGUF file's metadata as the Hugging Face ``config.json`` it stands for, so ``ModelConfig`` validates one
dict whatever the source.

Keys are llama.cpp's (``<arch>.block_count``, ``<arch>.attention.head_count`` ...). What the metadata leaves
implicit is read from the tensor table: a tied embedding is a file without ``output.weight``, Qwen2's q/k/v
biases are their tensors. Every missing or malformed key is a ``ModelLoadError`` naming the file and the key.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cinq.errors import ModelLoadError
from cinq.model.gguf.file import GGUFFile
from cinq.model.gguf.names import GGUF_ARCHITECTURES
from cinq.model.registry import ModelRegistry


def _key(gguf: GGUFFile, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    value = gguf.get(key)
    if value is None:
        if default is ...:
            raise ModelLoadError(f"{gguf.path}: metadata '{key}' is missing")
        return default
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.size and kind is int:
        raise ModelLoadError(f"{gguf.path}: metadata '{key}' is a per-layer array; cinq serves models whose "
                             f"layers share one value")
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ModelLoadError(f"{gguf.path}: metadata '{key}' must be {getattr(kind, '__name__', kind)}, "
                             f"got {value!r:.60}")
    return value


def gguf_config_dict(gguf: GGUFFile) -> dict[str, Any]:
    """The ``config.json`` dict of the model in ``gguf`` (validated later by ``ModelConfig.from_dict``)."""
    arch = gguf.architecture
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(f"{gguf.path}: metadata 'general.architecture': {arch!r} is not one cinq serves "
                             f"({', '.join(sorted(GGUF_ARCHITECTURES))})")
    if "rope_freqs.weight" in gguf.tensors:
        raise ModelLoadError(f"{gguf.path}: tensor 'rope_freqs.weight' (Llama 3.1-style rope frequency factors) is "
                             f"not supported yet")
    embed = gguf.tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        raise ModelLoadError(f"{gguf.path}: tensor 'token_embd.weight' is missing or not a matrix")
    vocab, hidden = embed.shape
    heads = _key(gguf, f"{arch}.attention.head_count", int)
    head_dim = _key(gguf, f"{arch}.attention.key_length", int, hidden // heads if heads else 0)
    rope_dims = _key(gguf, f"{arch}.rope.dimension_count", int, head_dim)
    if rope_dims != head_dim:
        raise ModelLoadError(f"{gguf.path}: metadata '{arch}.rope.dimension_count' is {rope_dims}, not the head "
                             f"dimension {head_dim}: partial rotary embeddings are not supported")
    cfg: dict[str, Any] = {
        "architectures": [GGUF_ARCHITECTURES[arch]],
        "model_type": ModelRegistry.info(GGUF_ARCHITECTURES[arch]).model_type,
        "vocab_size": vocab,
        "hidden_size": _key(gguf, f"{arch}.embedding_length", int, hidden),
        "intermediate_size": _key(gguf, f"{arch}.feed_forward_length", int),
        "num_hidden_layers": _key(gguf, f"{arch}.block_count", int),
        "num_attention_heads": heads,
        "num_key_value_heads": _key(gguf, f"{arch}.attention.head_count_kv", int, heads),
        "head_dim": head_dim,
        "max_position_embeddings": _key(gguf, f"{arch}.context_length", int, 2048),
        "rms_norm_eps": float(_key(gguf, f"{arch}.attention.layer_norm_rms_epsilon", (float, int), 1e-6)),
        "rope_theta": float(_key(gguf, f"{arch}.rope.freq_base", (float, int), 10000.0)),
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "attention_bias": "blk.0.attn_q.bias" in gguf.tensors,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }
    if arch == "gemma3":
        _gemma3_fields(gguf, cfg)
    if cfg["hidden_size"] != hidden:
        raise ModelLoadError(f"{gguf.path}: metadata '{arch}.embedding_length' is {cfg['hidden_size']}, but "
                             f"token_embd.weight has {hidden} columns")
    window = gguf.get(f"{arch}.attention.sliding_window")
    if isinstance(window, int) and window > 0:
        cfg["sliding_window"] = window
    for key, field in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        value = gguf.get(f"tokenizer.ggml.{key}")
        if isinstance(value, int) and not isinstance(value, bool):
            cfg[field] = value
    return cfg


# llama.cpp's Gemma 3 constants the metadata leaves out (its llama-model.cpp): every 6th layer is global, the
# local layers' rope base is 10k, the attention scale is head_dim ** -0.5 except for the 27B (62 layers:
# (hidden / heads) ** -0.5)
GEMMA3_SWA_PATTERN = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0


def _gemma3_fields(gguf: GGUFFile, cfg: dict[str, Any]) -> None:
    """Gemma 3's interleaved sliding-window layers, local rope base, attention scale, GeGLU and rope scaling."""
    layers = cfg["num_hidden_layers"]
    pattern = gguf.get("gemma3.attention.sliding_window_pattern")
    if isinstance(pattern, np.ndarray) and pattern.size == layers:  # per layer: true = sliding
        cfg["layer_types"] = ["sliding_attention" if bool(p) else "full_attention" for p in pattern]
    else:
        period = pattern if isinstance(pattern, int) and not isinstance(pattern, bool) and pattern > 0 \
            else GEMMA3_SWA_PATTERN
        cfg["layer_types"] = ["full_attention" if (i + 1) % period == 0 else "sliding_attention"
                              for i in range(layers)]
    cfg.setdefault("sliding_window", 4096)
    cfg["rope_local_base_freq"] = GEMMA3_LOCAL_ROPE_BASE
    cfg["query_pre_attn_scalar"] = (cfg["hidden_size"] // cfg["num_attention_heads"] if layers == 62
                                    else cfg["head_dim"])
    cfg["hidden_act"] = cfg["hidden_activation"] = "gelu_pytorch_tanh"
    kind = gguf.get("gemma3.rope.scaling.type")
    if kind == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear",
                               "factor": float(_key(gguf, "gemma3.rope.scaling.factor", (float, int)))}
