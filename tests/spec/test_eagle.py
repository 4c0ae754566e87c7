"""EAGLE / EAGLE-3 heads: shapes, the paged serving forward equal to the training-mode one, folder round trips
(bit-identical, vLLM's EAGLE-1 names), and heads refused on a target they were not trained for."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from cinq.errors import InvalidParameterError
from cinq.kernels.metadata import AttentionMetadata
from cinq.spec.eagle import default_feature_layers, load_eagle_head, new_eagle_head, save_eagle_head
from tests.spec.random_target import random_target

BLOCK = 4
# (sequence, start, end) of each step's new tokens: chunked prefill, a sequence joining mid-way, decodes
STEPS = [
    [("a", 0, 7), ("b", 0, 5)],
    [("b", 5, 6), ("c", 0, 1), ("a", 7, 12)],
    [("a", 12, 13), ("b", 6, 7), ("c", 1, 2)],
]
LENGTHS = {"a": 13, "b": 7, "c": 2}
TABLES = {"a": [9, 2, 5, 11], "b": [0, 7], "c": [4]}


def inputs(target, head, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(token after each position [n], fused target feature at each position [n, H]) of a random sequence."""
    ids = torch.randint(0, target.config.vocab_size, (n + 1,), generator=torch.Generator().manual_seed(seed))
    _, states = target.forward_with_hidden_states(ids[None])
    return ids[1:], head.fuse([states[i][0, :n] for i in head.feature_layers])


def test_default_feature_layers() -> None:
    assert default_feature_layers("eagle", 5) == (5,)
    assert default_feature_layers("eagle3", 5) == (1, 2, 4)  # cinq-tiny
    assert default_feature_layers("eagle3", 32) == (2, 16, 29)  # vLLM's choice for a Llama-8B
    assert default_feature_layers("eagle3", 2) == (0, 1, 2)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_shapes_and_the_target_weights_stay_the_targets(method: str) -> None:
    target = random_target()
    head = new_eagle_head(target, method)
    assert head.config.num_hidden_layers == 1 and len(head.attention_layers()) == 1
    assert not any("embed_tokens" in name or "lm_head" in name for name in head.state_dict())
    tokens, feats = inputs(target, head, 6, 0)
    nxt, normed = head(tokens[None].expand(2, 6), feats[None].expand(2, 6, 64), torch.arange(6).expand(2, 6), None)
    assert nxt.shape == normed.shape == (2, 6, 64)
    assert target.compute_logits(normed).shape == (2, 6, 97)
    assert (nxt is normed) == (method == "eagle")
    head.to(torch.bfloat16)
    assert target.model.embed_tokens.weight.dtype == torch.float32


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_paged_forward_equals_the_training_forward(method: str) -> None:
    target = random_target()
    head = new_eagle_head(target, method, seed=3)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)  # larger than the init: attention patterns that matter
    with torch.inference_mode():
        seqs = {name: inputs(target, head, n, i) for i, (name, n) in enumerate(LENGTHS.items())}
        plain = {name: head(tok[None], f[None], torch.arange(len(tok))[None], None) for name, (tok, f) in seqs.items()}
        head.attention_layers()[0].kv_cache = torch.full((2, 12, BLOCK, 2, 16), float("nan"))
        for step in STEPS:
            meta = AttentionMetadata.from_lens([e - s for _, s, e in step], [e for _, _, e in step],
                                               [TABLES[name] for name, _, _ in step], BLOCK)
            tokens = torch.cat([seqs[name][0][s:e] for name, s, e in step])
            feats = torch.cat([seqs[name][1][s:e] for name, s, e in step])
            positions = torch.cat([torch.arange(s, e) for _, s, e in step])
            nxt, normed = head(tokens, feats, positions, meta)
            for got, which in ((nxt, 0), (normed, 1)):
                expect = torch.cat([plain[name][which][0, s:e] for name, s, e in step])
                assert torch.allclose(got, expect, atol=1e-5, rtol=1e-4), f"{method}: step {step}"


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_load_round_trip_is_bit_identical(method: str, dtype: torch.dtype, tmp_path) -> None:
    target = random_target()
    head = new_eagle_head(target, method, seed=1).to(dtype)
    save_eagle_head(head, tmp_path)
    served = random_target().to(dtype)  # the same target, loaded as it is served
    loaded = load_eagle_head(tmp_path, served, dtype, "cpu", "sdpa")
    assert loaded.method == method and loaded.feature_layers == head.feature_layers
    assert loaded.config.num_hidden_layers == 1
    mine, theirs = head.state_dict(), loaded.state_dict()
    assert list(mine) == list(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert loaded._target_embed[0] is served.model.embed_tokens  # shared, not copied


def test_eagle_folder_uses_vllm_names(tmp_path) -> None:
    target = random_target()
    save_eagle_head(new_eagle_head(target, "eagle"), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["EagleLlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert cfg["num_hidden_layers"] == 1 and cfg["cinq_spec"]["method"] == "eagle"
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert tuple(f.get_slice("fc.weight").get_shape()) == (64, 128)
    assert {"layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight", "layers.0.mlp.gate_proj.weight",
            "layers.0.mlp.up_proj.weight", "layers.0.post_attention_layernorm.weight"} <= names
    assert not any("input_layernorm" in n or "embed_tokens" in n or "lm_head" in n for n in names)


def test_eagle3_folder_layout(tmp_path) -> None:
    target = random_target()
    save_eagle_head(new_eagle_head(target, "eagle3"), tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert tuple(f.get_slice("fuse_fc.weight").get_shape()) == (64, 3 * 64)
        assert {"norm.weight", "embedding_layernorm.weight", "hidden_states_layernorm.weight"} <= set(f.keys())


@pytest.mark.parametrize("other,field", [
    (dict(seed=5), "fingerprint"),
    (dict(hidden_size=32), "hidden_size"),
    (dict(vocab_size=101), "vocab_size"),
    (dict(num_layers=2), "num_hidden_layers"),
])
def test_load_refuses_a_head_for_another_target(other: dict, field: str, tmp_path) -> None:
    save_eagle_head(new_eagle_head(random_target(), "eagle3"), tmp_path)
    with pytest.raises(InvalidParameterError) as e:
        load_eagle_head(tmp_path, random_target(**other), torch.float32, "cpu", "sdpa")
    assert e.value.param == "model" and field in str(e.value)
