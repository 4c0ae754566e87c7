"""ModelRegistry (cinq/model/registry.py) and the CausalLM interface: architectures resolve to their class, the
loader, saver and calibration build whatever class is registered (an out-of-tree family needs no other edit),
and features a family lists as unsupported are refused naming it."""

from __future__ import annotations

import pytest
import torch

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.model.config import ModelConfig
from cinq.model.interface import CausalLM, check_supported
from cinq.model.llama import LlamaForCausalLM
from cinq.model.registry import ModelArchInfo, ModelRegistry

BASE = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2}


def test_every_llama_family_architecture_keeps_its_defaults():
    for arch, bias, qk in [("LlamaForCausalLM", False, False), ("MistralForCausalLM", False, False),
                           ("Qwen2ForCausalLM", True, False), ("Qwen3ForCausalLM", False, True)]:
        cfg = ModelConfig.from_dict({"architectures": [arch], **BASE})
        assert (cfg.architecture, cfg.attention_bias, cfg.qk_norm) == (arch, bias, qk)
        assert ModelRegistry.model_class(arch) is LlamaForCausalLM
    assert ModelConfig.from_dict({"model_type": "qwen2", **BASE}).architecture == "Qwen2ForCausalLM"


def test_unknown_architecture_lists_what_is_supported():
    with pytest.raises(ModelLoadError, match="Gemma3ForCausalLM.*LlamaForCausalLM"):
        ModelConfig.from_dict({"architectures": ["FalconForCausalLM"], **BASE})


def test_both_families_follow_the_interface():
    for arch in ("LlamaForCausalLM", "Gemma3ForCausalLM"):
        cls = ModelRegistry.model_class(arch)
        cfg = ModelConfig.from_dict({"architectures": [arch], **BASE, "sliding_window": 4,
                                     "layer_types": ["sliding_attention", "full_attention"]})
        assert isinstance(cls(cfg), CausalLM)


class _OutOfTree(LlamaForCausalLM):
    """A family registered from outside cinq: the loader must build it through the registry."""


def test_an_out_of_tree_family_is_one_registration(tmp_path):
    from cinq.model.loader import load_model
    from cinq.model.saver import init_random_model, save_model
    ModelRegistry.register_model(ModelArchInfo("OutOfTreeForCausalLM", "out_of_tree", __name__, "_OutOfTree"))
    try:
        cfg = ModelConfig.from_dict({"architectures": ["OutOfTreeForCausalLM"], **BASE})
        model = init_random_model(cfg)
        assert type(model) is _OutOfTree
        loaded = load_model(save_model(model, tmp_path / "m"), "float32")
        assert type(loaded) is _OutOfTree
        ids = torch.arange(10)[None]
        torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)
    finally:
        ModelRegistry._infos.pop("OutOfTreeForCausalLM")


def test_check_supported_names_the_family_and_the_reason():
    gemma = ModelRegistry.model_class("Gemma3ForCausalLM")
    with pytest.raises(InvalidParameterError, match="Gemma3ForCausalLM does not support awq yet: .*gptq or rtn"):
        check_supported(gemma, "awq", "method")
    check_supported(LlamaForCausalLM, "awq", "method")  # the Llama family supports everything
