"""Build tiny random-weight model folders with transformers' save_pretrained (plus cinq's byte tokenizer).

Weights use a larger init than HF's default so that the next-token distributions are peaked: greedy parity
tests then compare clear winners, not near-ties.
"""

from __future__ import annotations

from pathlib import Path

import torch

from cinq.model.byte_tokenizer import build_byte_tokenizer, save_byte_tokenizer

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.15, rms_norm_eps=1e-6)

ARCHS = ("llama", "llama3", "mistral", "qwen2", "qwen3")


def hf_config(arch: str, vocab_size: int, bos: int, eos: int):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config
    kw = dict(COMMON, vocab_size=vocab_size, bos_token_id=bos, eos_token_id=eos)
    if arch == "llama":
        return LlamaConfig(**kw)
    if arch == "llama3":  # Llama-3 rope scaling, untied, GQA 4:1
        return LlamaConfig(**dict(kw, num_key_value_heads=1, rope_theta=500000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32}))
    if arch == "mistral":
        return MistralConfig(**dict(kw, sliding_window=None))
    if arch == "qwen2":  # qkv bias, tied embeddings
        return Qwen2Config(**dict(kw, tie_word_embeddings=True))
    if arch == "llama_d64":  # head_dim 64 (the bf16 decode attention's), 3 query heads over 1 kv head
        return LlamaConfig(**dict(kw, hidden_size=192, num_attention_heads=3, num_key_value_heads=1))
    if arch == "qwen3":  # q/k norm, explicit head_dim different from hidden/heads
        return Qwen3Config(**dict(kw, head_dim=32))
    raise ValueError(arch)


def build_tiny_model(path: Path, arch: str = "llama", seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM
    tok = build_byte_tokenizer()
    cfg = hf_config(arch, tok.get_vocab_size(), tok.token_to_id("<|bos|>"), tok.token_to_id("<|end|>"))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # biases default to zero; make them matter for the qwen2 parity check
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    model.save_pretrained(path)
    save_byte_tokenizer(path)
    return path
