"""Fixtures for the quantization tests: tiny Llama folders (random, and trained for a few seconds on
arithmetic text so that activations have the structure real models have) with the byte tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cinq.tasks import arithmetic_problems
from cinq.model.byte_tokenizer import build_byte_tokenizer, save_byte_tokenizer
from cinq.model.config import ModelConfig
from cinq.model.saver import init_random_model, save_model


def tiny_config(hidden: int = 64, inter: int = 128, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                vocab: int | None = None, **extra) -> ModelConfig:
    tok = build_byte_tokenizer()
    return ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": vocab or tok.get_vocab_size(), "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "max_position_embeddings": 512, "tie_word_embeddings": True,
        "bos_token_id": tok.token_to_id("<|bos|>"), "eos_token_id": tok.token_to_id("<|end|>"), **extra})


def arithmetic_text(n: int, seed: int = 0, split: str = "train") -> str:
    return "".join(p.text() for p in arithmetic_problems(n, seed=seed, split=split))


def train_tiny(config: ModelConfig, steps: int = 80, seed: int = 0, seq: int = 64, batch: int = 8) -> torch.nn.Module:
    """A few seconds of next-token training on arithmetic text (byte tokens)."""
    torch.manual_seed(seed)
    model = init_random_model(config, seed=seed)
    tok = build_byte_tokenizer()
    ids = torch.tensor(tok.encode(arithmetic_text(400, seed=seed), add_special_tokens=False).ids)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, ids.numel() - seq - 1, (batch,), generator=gen)
        x = torch.stack([ids[s:s + seq + 1] for s in starts.tolist()])
        logits = model.compute_logits(model(x[:, :-1]))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def write_folder(model: torch.nn.Module, path: Path) -> Path:
    save_model(model, path)
    save_byte_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def trained_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trained 2-layer Llama (hidden 64, GQA 4/2) folder, shared by the session."""
    return write_folder(train_tiny(tiny_config()), tmp_path_factory.mktemp("trained-tiny"))


@pytest.fixture(scope="session")
def random_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer MHA Llama with qkv bias (Qwen2 layout) folder."""
    cfg = tiny_config(heads=4, kv_heads=4, architectures=["Qwen2ForCausalLM"], tie_word_embeddings=False)
    model = init_random_model(cfg, seed=1)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return write_folder(model, tmp_path_factory.mktemp("random-tiny"))


@pytest.fixture(scope="session")
def calib_tokens() -> torch.Tensor:
    """[16, 64] byte-token windows of arithmetic text (the training distribution, other problems)."""
    from cinq.quant.calibration import calibration_windows
    tok = build_byte_tokenizer()
    ids = tok.encode(arithmetic_text(200, seed=7, split="validation"), add_special_tokens=False).ids
    return calibration_windows(ids, 16, 64, seed=0)
