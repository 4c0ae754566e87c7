"""Each backend inside the decoder: a paged, chunked, continuously batched run of a tiny random Llama must give
the hidden states of its plain full-sequence forward (the engine-level HF-parity tests build on this)."""

from __future__ import annotations

import pytest
import torch

from cinq.kernels.backends import available_backends
from cinq.kernels.metadata import AttentionMetadata
from cinq.model.config import ModelConfig
from cinq.model.saver import init_random_model

BLOCK = 4
# (sequence, start, end) of the new tokens each step: chunked prefill, a prompt joining mid-way, mixed steps.
STEPS = [
    [("a", 0, 8), ("b", 0, 6)],
    [("b", 6, 7), ("c", 0, 1), ("a", 8, 13)],
    [("a", 13, 14), ("b", 7, 8), ("c", 1, 2)],
]
LENGTHS = {"a": 14, "b": 8, "c": 2}
TABLES = {"a": [9, 2, 5, 11], "b": [0, 7], "c": [4]}  # scattered, shuffled blocks


# "triton" runs compiled on CUDA, interpreted on CPU (tests/kernels/conftest.py sets TRITON_INTERPRET)
@pytest.mark.parametrize("backend", available_backends())
def test_paged_steps_reproduce_the_plain_forward(backend: str) -> None:
    config = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 64,
    })
    model = init_random_model(config, seed=0, std=0.2).eval()
    model.set_attention_backend(backend)
    g = torch.Generator().manual_seed(1)
    tokens = {name: torch.randint(0, 97, (n,), generator=g) for name, n in LENGTHS.items()}
    with torch.inference_mode():
        plain = {name: model(ids[None])[0] for name, ids in tokens.items()}
        for attn in model.attention_layers():
            attn.kv_cache = torch.full((2, 12, BLOCK, 2, 16), float("nan"))  # stale data must never be read
        for step in STEPS:
            meta = AttentionMetadata.from_lens([e - s for _, s, e in step], [e for _, _, e in step],
                                               [TABLES[name] for name, _, _ in step], BLOCK)
            ids = torch.cat([tokens[name][s:e] for name, s, e in step])
            positions = torch.cat([torch.arange(s, e) for _, s, e in step])
            hidden = model(ids, positions, meta)
            expect = torch.cat([plain[name][s:e] for name, s, e in step])
            err = (hidden - expect).abs().max() / expect.abs().max()
            assert err < 1e-5, f"{backend}: step {step} relative error {err:.2e}"
