"""Medusa heads: shapes, an untrained head is the target's own LM head, folder round trips (bit-identical,
vLLM's names) and heads refused on another target."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from cinq.errors import InvalidParameterError
from cinq.spec.medusa import load_medusa_heads, new_medusa_heads, save_medusa_heads
from tests.spec.random_target import random_target


def test_shapes_and_the_untrained_heads_are_the_targets_lm_head() -> None:
    target = random_target()
    heads = new_medusa_heads(target, num_heads=3)
    hidden = target(torch.randint(0, 97, (1, 5)))[0]
    logits = heads(hidden)
    assert logits.shape == (5, 3, 97) and logits.dtype == torch.float32
    for i in range(3):  # residual blocks start at zero, LM heads as the target's
        assert torch.allclose(logits[:, i], target.compute_logits(hidden), atol=1e-5)
        assert torch.equal(heads.head_logits(hidden, i), logits[:, i])
    assert heads.lm_heads[0].weight.data_ptr() != target.lm_head.weight.data_ptr()  # own copies, trained apart


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_load_round_trip_is_bit_identical(dtype: torch.dtype, tmp_path) -> None:
    target = random_target()
    heads = new_medusa_heads(target, num_heads=2)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    heads = heads.to(dtype)
    save_medusa_heads(heads, tmp_path)
    loaded = load_medusa_heads(tmp_path, random_target().to(dtype), dtype, "cpu")
    mine, theirs = heads.state_dict(), loaded.state_dict()
    assert list(mine) == list(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert loaded.num_heads == 2


def test_folder_uses_vllm_names(tmp_path) -> None:
    save_medusa_heads(new_medusa_heads(random_target(), num_heads=2), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["MedusaModel"] and cfg["num_heads"] == 2 and cfg["num_hidden_layers"] == 1
    assert cfg["medusa_fc_bias"] is True and cfg["cinq_spec"]["method"] == "medusa"
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == {"blocks.0.layers.0.weight", "blocks.0.layers.0.bias", "blocks.1.layers.0.weight",
                                 "blocks.1.layers.0.bias", "lm_heads.0.weight", "lm_heads.1.weight"}


@pytest.mark.parametrize("other,field", [(dict(seed=9), "fingerprint"), (dict(vocab_size=50), "vocab_size"),
                                         (dict(hidden_size=32), "hidden_size")])
def test_load_refuses_heads_for_another_target(other: dict, field: str, tmp_path) -> None:
    save_medusa_heads(new_medusa_heads(random_target(), num_heads=2), tmp_path)
    with pytest.raises(InvalidParameterError) as e:
        load_medusa_heads(tmp_path, random_target(**other), torch.float32, "cpu")
    assert e.value.param == "model" and field in str(e.value)


def test_heads_sharing_the_targets_lm_head_store_only_their_blocks(tmp_path) -> None:
    target = random_target()
    heads = new_medusa_heads(target, num_heads=2, original_lm_head=True)
    assert heads.original_lm_head and not any("lm_head" in k for k in heads.state_dict())
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    hidden = target(torch.randint(0, 97, (1, 4)))[0]
    save_medusa_heads(heads, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["original_lm_head"] is True
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert not any(k.startswith("lm_heads") for k in f.keys())
    served = random_target()
    loaded = load_medusa_heads(tmp_path, served, torch.float32, "cpu")
    assert loaded.original_lm_head and loaded._target_lm_head[0] is served.lm_head
    assert torch.equal(loaded(hidden), heads(hidden))
    assert torch.equal(loaded.head_logits(hidden, 1),
                       served.compute_logits(loaded.blocks[1](hidden)))
