"""Write a cinq model as a Hugging Face folder (config.json + model.safetensors) that cinq and ``transformers``
both load (merged projections are written as HF's separate q/k/v and gate/up tensors); and build randomly
initialised models of a given shape (tests, benchmarks, `cinq init-model`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from cinq.model.byte_tokenizer import SPECIALS
from cinq.model.checkpoint_names import checkpoint_state_dict
from cinq.model.config import ModelConfig
from cinq.model.generation_defaults import TURN_MARKERS, cinq_generation_config, turn_marker_ids
from cinq.model.interface import CausalLM
from cinq.model.registry import ModelRegistry


def hf_config_dict(config: ModelConfig, dtype: torch.dtype | None = None) -> dict[str, Any]:
    """The config.json content describing ``config`` in Hugging Face's vocabulary."""
    out: dict[str, Any] = {
        "architectures": [config.architecture],
        "model_type": ModelRegistry.info(config.architecture).model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.attention_bias,
        "mlp_bias": config.mlp_bias,
        "hidden_act": config.hidden_act,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_ids[0] if len(config.eos_token_ids) == 1 else (config.eos_token_ids or None),
    }
    if config.sliding_window is not None:
        out["sliding_window"] = config.sliding_window
    if config.layer_types is not None:  # Gemma 3: per-layer windows, local rope base, attention scale
        out["layer_types"] = list(config.layer_types)
        out["rope_local_base_freq"] = config.rope_local_theta
        scalar = config.query_pre_attn_scalar
        out["query_pre_attn_scalar"] = int(scalar) if scalar is not None and scalar.is_integer() else scalar
        out["hidden_activation"] = config.hidden_act
    if dtype is not None:
        out["torch_dtype"] = str(dtype).removeprefix("torch.")
    if config.quantization_config:
        out["quantization_config"] = config.quantization_config
    return out


def save_model(model: CausalLM, path: str | Path, dtype: torch.dtype | None = None,
               extra_config: dict[str, Any] | None = None, tokenizer: str | Path | None = None) -> Path:
    """Save weights (safetensors under Hugging Face names, tied LM head stored once), config.json and
    generation_config.json into ``path``.

    ``tokenizer``: the folder of the tokenizer the model is used with (default: recognised from the model's
    special ids, see ``chat_turn_markers``). When it has the chat template's turn markers, generation_config.json
    gets them as eos ids and cinq's sampling defaults (cinq/model/generation_defaults.py)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for name, t in checkpoint_state_dict(model).items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        t = t.detach().to("cpu")
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        tensors[name] = t.contiguous()
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = hf_config_dict(model.config, dtype or next(model.parameters()).dtype)
    cfg.update(extra_config or {})
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    markers = chat_turn_markers(model.config, tokenizer)
    if model.config.eos_token_ids or markers:
        gen = cinq_generation_config(model.config.bos_token_id, model.config.eos_token_ids, markers)
        (path / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return path


def chat_turn_markers(config: ModelConfig, tokenizer: str | Path | None = None) -> list[int]:
    """The ids of the chat template's turn markers in the model's tokenizer ([] when it has none): looked up in
    ``tokenizer`` (a folder with tokenizer.json) when given; else taken from cinq's own layout when the model's
    special ids are those of a tokenizer trained by cinq (cinq/train/tokenizer_train.py puts ``SPECIALS`` first:
    ``<|bos|>`` is 0 and ``<|end|>`` 6), which is how the models cinq trains are saved (cinq/train/export.py
    copies the tokenizer only after the weights)."""
    if tokenizer is not None:
        from tokenizers import Tokenizer
        file = Path(tokenizer) / "tokenizer.json"
        return turn_marker_ids(Tokenizer.from_file(str(file)).token_to_id) if file.is_file() else []
    cinq_layout = config.bos_token_id == SPECIALS.index("<|bos|>") \
        and SPECIALS.index("<|end|>") in config.eos_token_ids and config.vocab_size > len(SPECIALS)
    return [SPECIALS.index(m) for m in TURN_MARKERS] if cinq_layout else []


def init_random_model(config: ModelConfig, seed: int = 0, std: float = 0.02,
                      dtype: torch.dtype = torch.float32) -> CausalLM:
    """A model with N(0, std) weights (norm weights 1, biases 0), reproducible from ``seed``. Merged projections
    draw shard by shard, so the weights are those of separate q/k/v and gate/up drawn in the checkpoint's order."""
    gen = torch.Generator().manual_seed(seed)
    model = ModelRegistry.model_class(config.architecture)(config)
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # Gemma's (1 + w) norms start at w = 0
                p.fill_(getattr(modules[name.rpartition(".")[0]], "init_weight", 1.0))
            elif name.endswith(".bias"):
                p.zero_()
            else:
                shards = getattr(modules[name.rpartition(".")[0]], "output_shards", None)
                rows = (p.shape[0],) if shards is None else shards.sizes
                p.copy_(torch.cat([torch.randn((r, *p.shape[1:]), generator=gen) for r in rows]) * std)
    return model.to(dtype)
