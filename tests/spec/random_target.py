"""Tiny random targets for the speculative-head tests (built in memory, no folder needed)."""

from __future__ import annotations

from cinq.model.config import ModelConfig
from cinq.model.llama import LlamaForCausalLM
from cinq.model.saver import init_random_model


def random_target(seed: int = 0, hidden_size: int = 64, vocab_size: int = 97, num_layers: int = 3) -> LlamaForCausalLM:
    config = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": vocab_size, "hidden_size": hidden_size,
        "intermediate_size": 96, "num_hidden_layers": num_layers, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 128, "tie_word_embeddings": True,
    })
    model = init_random_model(config, seed=seed, std=0.2).eval()
    model.requires_grad_(False)
    return model
