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


def _tiny_model(backend: str):
    config = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 97, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 64,
    })
    model = init_random_model(config, seed=0, std=0.2).eval()
    model.set_attention_backend(backend)
    return model


# "triton" runs compiled on CUDA, interpreted on CPU (tests/kernels/conftest.py sets TRITON_INTERPRET)
@pytest.mark.parametrize("backend", available_backends())
def test_paged_steps_reproduce_the_plain_forward(backend: str) -> None:
    model = _tiny_model(backend)
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


# A candidate tree under each of two sequences: row 0 is the root (the last committed token), parents first.
TREE_PARENTS = [-1, 0, 0, 1, 1, 2, 3]
OTHER_PARENTS = [-1, 0, 1, 0, 3, 3, 2]  # the second sequence's own tree, when trees are per sequence (EAGLE-2)
TREE_CONTEXT = {"a": 9, "b": 2}  # tokens already in the cache before the root


@pytest.mark.parametrize("per_seq", [False, True])
@pytest.mark.parametrize("backend", available_backends())
def test_tree_rows_reproduce_the_plain_forward_of_their_paths(backend: str, per_seq: bool) -> None:
    # tree verification end to end: row i, at position context + depth(i), must give the hidden state of the
    # plain forward of context + the tokens on the root-to-i path
    from cinq.kernels.metadata import tree_mask_from_parents, tree_masks_from_parents

    model = _tiny_model(backend)
    trees = {"a": TREE_PARENTS, "b": OTHER_PARENTS if per_seq else TREE_PARENTS}
    q, depth = len(TREE_PARENTS), {}
    for name, parents in trees.items():
        depth[name] = [0]
        for p in parents[1:]:
            depth[name].append(depth[name][p] + 1)
    g = torch.Generator().manual_seed(2)
    context = {name: torch.randint(0, 97, (n,), generator=g) for name, n in TREE_CONTEXT.items()}
    nodes = {name: torch.randint(0, 97, (q,), generator=g) for name in TREE_CONTEXT}
    tables = {"a": [5, 1, 8, 3], "b": [2, 10, 6]}
    with torch.inference_mode():
        for attn in model.attention_layers():
            attn.kv_cache = torch.full((2, 12, BLOCK, 2, 16), float("nan"))
        names = list(TREE_CONTEXT)
        prefill = AttentionMetadata.from_lens([TREE_CONTEXT[n] for n in names], [TREE_CONTEXT[n] for n in names],
                                              [tables[n] for n in names], BLOCK)
        model(torch.cat([context[n] for n in names]),
              torch.cat([torch.arange(TREE_CONTEXT[n]) for n in names]), prefill)
        mask = tree_masks_from_parents([trees[n] for n in names]) if per_seq else tree_mask_from_parents(TREE_PARENTS)
        meta = AttentionMetadata.from_lens([q, q], [TREE_CONTEXT[n] + q for n in names], [tables[n] for n in names],
                                           BLOCK, decode_query_len=q, tree_mask=mask)
        positions = torch.cat([TREE_CONTEXT[n] + torch.tensor(depth[n]) for n in names])
        hidden = model(torch.cat([nodes[n] for n in names]), positions, meta)
        for s, name in enumerate(names):
            for i in range(q):
                path, j = [], i
                while j >= 0:
                    path.insert(0, j)
                    j = trees[name][j]
                plain = model(torch.cat([context[name], nodes[name][path]])[None])[0, -1]
                got = hidden[s * q + i]
                err = (got - plain).abs().max() / plain.abs().max()
                assert err < 1e-5, f"{backend}: sequence {name} row {i} relative error {err:.2e}"
