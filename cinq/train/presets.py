"""Model shapes of the shipped models, by name (or any HF config.json path / JSON dict).

cinq-tiny (~11M parameters with the 8k vocabulary, tied embeddings) was sized from measured training speed on
a 2-core CPU: 5 layers of width 384 (6 heads of 64, 2 KV heads: grouped-query attention, so the serving
engine's GQA path runs on the default model). The student is ~1.8M parameters: width 128, 4 layers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cinq.errors import InvalidParameterError
from cinq.model.config import ModelConfig

PRESETS: dict[str, dict[str, Any]] = {
    "cinq-tiny": {"hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 5,
                  "num_attention_heads": 6, "num_key_value_heads": 2},
    "cinq-tiny-student": {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
                          "num_attention_heads": 4, "num_key_value_heads": 2},
    # For tests and smoke runs.
    "micro": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2},
}


def model_config(spec: str | dict[str, Any], vocab_size: int, bos_id: int | None, eos_id: int | None,
                 max_position_embeddings: int = 2048) -> ModelConfig:
    """A Llama ModelConfig from a preset name, a JSON file (a config.json or a folder holding one) or a dict;
    vocabulary and special ids come from the tokenizer."""
    if isinstance(spec, dict):
        shape = dict(spec)
    elif spec in PRESETS:
        shape = dict(PRESETS[spec])
    else:
        path = Path(spec)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise InvalidParameterError(
                f"model config {spec!r} is neither a preset ({sorted(PRESETS)}) nor a JSON file", "config")
        shape = json.loads(path.read_text())
    cfg = {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": max_position_embeddings,
           "tie_word_embeddings": True, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu"}
    cfg.update({k: v for k, v in shape.items() if k not in ("vocab_size", "bos_token_id", "eos_token_id")})
    cfg.update({"vocab_size": vocab_size, "bos_token_id": bos_id, "eos_token_id": eos_id})
    return ModelConfig.from_dict(cfg)


def new_model(config: ModelConfig, seed: int = 0):
    """A freshly initialised model for training: N(0, 0.02) weights, the residual-stream output projections
    (o_proj, down_proj) scaled by 1/sqrt(2 * layers) as in GPT-2, so deep stacks start with unit-scale residuals."""
    import math

    import torch

    from cinq.model.saver import init_random_model
    model = init_random_model(config, seed=seed, std=0.02)
    scale = 1.0 / math.sqrt(2 * config.num_hidden_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(scale)
    return model
