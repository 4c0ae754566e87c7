"""Random-weight Llama folders for benchmarks whose subject is speed, not text: built once per folder, in Hugging
Face's layout with a byte-level tokenizer (ids past its 263 tokens decode to nothing; detokenization still runs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class LlamaShape:
    """The few numbers that size a Llama."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = True


# The ~110M model every CPU benchmark uses (tied embeddings: 768 / 12 layers / 2048 / vocab 32000).
LLAMA_110M = LlamaShape(768, 12, 12, 12, 2048, 32000, True)
# A Llama-3.2-1B-like shape (GQA 32/8, untied head): large enough that a GPU step is a weight stream.
LLAMA_1B = LlamaShape(2048, 16, 32, 8, 8192, 32000, False)


def build_random_llama(folder: str | Path, shape: LlamaShape = LLAMA_110M, seed: int = 0) -> Path:
    """``folder`` holding a bf16 random-weight Llama of ``shape`` (kept if it already has a config.json)."""
    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    import torch

    from cinq.model.byte_tokenizer import save_byte_tokenizer
    from cinq.model.config import ModelConfig
    from cinq.model.saver import init_random_model, save_model
    config = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": shape.vocab, "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate, "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads, "max_position_embeddings": 2048,
        "tie_word_embeddings": shape.tied, "bos_token_id": 256, "eos_token_id": 262})
    save_model(init_random_model(config, seed=seed, dtype=torch.bfloat16), folder, torch.bfloat16)
    save_byte_tokenizer(folder)
    return folder
