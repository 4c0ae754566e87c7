"""Offline acceptance of EAGLE heads on a target they were not trained on (a quantized copy of theirs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cinq.errors import InvalidParameterError
from benchmarks.head_transfer import held_out_acceptance
from cinq.model.loader import load_model
from cinq.quant.config import QuantConfig
from cinq.quant.pipeline import quantize_model
from cinq.spec.eagle import new_eagle_head, save_eagle_head

PROMPTS = [[5, 9, 13, 5, 9, 13, 5], [20, 21, 22, 23], [7, 7, 7, 7, 7, 7]]


def test_dense_trained_heads_are_scored_on_a_quantized_copy(tiny_llama: Path, tmp_path: Path) -> None:
    int4 = tmp_path / "int4"
    quantize_model(tiny_llama, int4, QuantConfig("rtn", 4, 32), None, progress=False)
    dense = load_model(tiny_llama, torch.float32)
    heads = {f"seed{s}": save_eagle_head(new_eagle_head(dense, "eagle", seed=s), tmp_path / f"h{s}") for s in (1, 2)}
    got = held_out_acceptance(int4, heads, PROMPTS, max_tokens=12, k=3)
    assert set(got) == set(heads)
    for r in got.values():
        assert 1.0 <= r["tau"] <= 4.0 and r["steps"] >= len(PROMPTS) and len(r["accept_rate"]) == 3
    assert held_out_acceptance(int4, heads, PROMPTS, max_tokens=12, k=3) == got  # greedy: deterministic


def test_a_head_for_another_target_is_refused(tiny_llama: Path, tiny_models, tmp_path: Path) -> None:
    other = load_model(tiny_models("qwen2"), torch.float32)
    head = save_eagle_head(new_eagle_head(other, "eagle", seed=1), tmp_path / "h")
    with pytest.raises(InvalidParameterError) as e:
        held_out_acceptance(tiny_llama, {"h": head}, PROMPTS, max_tokens=4, k=2)
    assert e.value.param == "model"
