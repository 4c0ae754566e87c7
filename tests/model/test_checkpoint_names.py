"""Checkpoint names through the stacked-params mapping: q/k/v and gate/up fill the right rows of the merged
projections, errors name the checkpoint tensor, and save -> load writes HF names and gives identical logits."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from cinq.errors import ModelLoadError
from cinq.model.checkpoint_names import Target, checkpoint_state_dict, expected_checkpoint_names, resolve
from cinq.model.loader import load_model
from cinq.model.saver import save_model


def logits(model, ids=((5, 6, 7, 8, 9, 10),)):
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids)))


def test_shards_go_to_their_rows(tiny_models):
    path = tiny_models("qwen2")  # q/k/v biases, GQA
    tensors = load_file(path / "model.safetensors")
    model = load_model(path, "float32")
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    p = "model.layers.1"
    q, k = model.config.q_size, model.config.kv_size
    w = attn.qkv_proj.weight.detach()
    assert torch.equal(w[:q], tensors[f"{p}.self_attn.q_proj.weight"])
    assert torch.equal(w[q:q + k], tensors[f"{p}.self_attn.k_proj.weight"])
    assert torch.equal(w[q + k:], tensors[f"{p}.self_attn.v_proj.weight"])
    assert torch.equal(attn.qkv_proj.bias.detach()[q:q + k], tensors[f"{p}.self_attn.k_proj.bias"])
    i = model.config.intermediate_size
    assert torch.equal(mlp.gate_up_proj.weight.detach()[i:], tensors[f"{p}.mlp.up_proj.weight"])


def test_resolve_and_expected_names(tiny_llama):
    model = load_model(tiny_llama, "float32")
    modules = dict(model.named_modules())
    mapping = model.stacked_params_mapping
    assert resolve(modules, mapping, "model.layers.0.self_attn.v_proj.weight") == \
        Target("model.layers.0.self_attn.qkv_proj", "weight", "v")
    assert resolve(modules, mapping, "model.layers.0.mlp.gate_proj.weight") == \
        Target("model.layers.0.mlp.gate_up_proj", "weight", 0)
    assert resolve(modules, mapping, "model.layers.0.mlp.down_proj.weight") == \
        Target("model.layers.0.mlp.down_proj", "weight")
    assert resolve(modules, mapping, "model.layers.0.self_attn.qkv_proj.weight") is None  # not a checkpoint name
    with safe_open(str(tiny_llama / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    skip = {"lm_head.weight"} if model.config.tie_word_embeddings else None
    assert set(expected_checkpoint_names(model, skip)) == names


@pytest.mark.parametrize("shard", ["k_proj", "up_proj"])
def test_missing_or_misshapen_shard_is_named(tiny_llama, tmp_path, shard):
    name = f"model.layers.0.{'self_attn' if shard == 'k_proj' else 'mlp'}.{shard}.weight"
    for case in ("missing", "shape"):
        path = tmp_path / case
        shutil.copytree(tiny_llama, path)
        tensors = load_file(path / "model.safetensors")
        if case == "missing":
            del tensors[name]
        else:
            tensors[name] = tensors[name][:-1].clone()
        save_file(tensors, path / "model.safetensors")
        pattern = re.escape(name) + (r"'?: shape \(\d+, 64\) does not match shard" if case == "shape" else "")
        with pytest.raises(ModelLoadError, match=pattern):
            load_model(path, "float32")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_save_load_round_trip_keeps_hf_names_and_logits(tiny_models, tmp_path, arch):
    src = tiny_models(arch)
    model = load_model(src, "float32")
    out = save_model(model, tmp_path / "saved")
    with safe_open(str(src / "model.safetensors"), "pt") as a, safe_open(str(out / "model.safetensors"), "pt") as b:
        assert set(a.keys()) == set(b.keys())
        for name in a.keys():
            assert torch.equal(a.get_tensor(name), b.get_tensor(name)), name
    assert torch.equal(logits(load_model(out, "float32")), logits(model))
    assert "self_attn.qkv_proj.weight" not in "".join(checkpoint_state_dict(model))


def test_saved_folder_loads_in_transformers(tiny_models, tmp_path):
    transformers = pytest.importorskip("transformers")
    model = load_model(tiny_models("qwen2"), "float32")
    out = save_model(model, tmp_path / "saved")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        ref = hf(ids).logits
    assert float((logits(model) - ref).abs().max()) <= 1e-4


def test_mixed_kinds_keep_the_projections_apart(tiny_llama, tmp_path):
    """A quantized folder whose k_proj stays dense (modules_to_not_convert) loads unmerged through the mapping."""
    from cinq.quant.config import QuantConfig
    from cinq.quant.pipeline import quantize_model
    out = tmp_path / "q"
    quantize_model(tiny_llama, out, QuantConfig(method="rtn", bits=8, group_size=32), progress=False)
    dense = load_file(tiny_llama / "model.safetensors")
    tensors = load_file(out / "model.safetensors")
    for i in range(2):
        p = f"model.layers.{i}.self_attn.k_proj"
        for key in ("qweight", "qzeros", "scales", "g_idx"):
            del tensors[f"{p}.{key}"]
        tensors[f"{p}.weight"] = dense[f"{p}.weight"]
    save_file(tensors, out / "model.safetensors")
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"]["modules_to_not_convert"] = ["self_attn.k_proj"]
    (out / "config.json").write_text(json.dumps(cfg))
    q = load_model(out, "float32")
    attn = q.model.layers[0].self_attn
    assert attn.qkv_proj is None and type(attn.k_proj).__name__ == "DenseLinear"
    assert type(attn.q_proj).__name__ == "GPTQLinear" and type(q.model.layers[0].mlp.gate_up_proj).__name__ == \
        "GPTQLinear"
    ref = logits(load_model(tiny_llama, "float32"))
    assert float((logits(q) - ref).abs().max()) < 0.05 * float(ref.abs().max())
