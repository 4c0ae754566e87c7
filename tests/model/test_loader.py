"""Loader: HF folders load unchanged (single file or sharded); every problem is an error naming the tensor."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from cinq.errors import ModelLoadError
from cinq.model.loader import load_model


def copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def logits(model, ids=((5, 6, 7, 8),)):
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(ids)))


def test_sharded_checkpoint_loads_like_single_file(tiny_llama, tmp_path):
    path = copy(tiny_llama, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, path / file)
    (path / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert torch.equal(logits(load_model(path, "float32")), logits(load_model(tiny_llama, "float32")))


def test_missing_tensor_is_named(tiny_llama, tmp_path):
    path = copy(tiny_llama, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(path)


def test_shape_mismatch_is_named_with_both_shapes(tiny_llama, tmp_path):
    path = copy(tiny_llama, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    tensors["model.norm.weight"] = torch.ones(65)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"model\.norm\.weight.*\(65,\).*\(64,\)"):
        load_model(path)


def test_unexpected_tensor_is_named(tiny_llama, tmp_path):
    path = copy(tiny_llama, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.mlp.extra.weight"] = torch.ones(2)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"model\.layers\.0\.mlp\.extra\.weight"):
        load_model(path)


def test_unsupported_architecture_and_pickles_are_refused(tiny_llama, tmp_path):
    path = copy(tiny_llama, tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(cfg, architectures=["GPT2LMHeadModel"], model_type="gpt2")))
    with pytest.raises(ModelLoadError, match="GPT2LMHeadModel"):
        load_model(path)
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "model.safetensors").rename(path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="safetensors only"):
        load_model(path)


def test_quantized_folder_loads_without_a_flag_and_skips_stray_biases(tiny_llama, tmp_path):
    from cinq.quant.config import QuantConfig
    from cinq.quant.pipeline import quantize_model
    out = tmp_path / "q"
    quantize_model(tiny_llama, out, QuantConfig(method="rtn", bits=8, group_size=32), progress=False)
    files = sorted(out.glob("*.safetensors"))
    tensors = load_file(files[0])
    qname = next(k for k in tensors if k.endswith("q_proj.qweight"))
    tensors[qname.replace("qweight", "bias")] = torch.zeros(64)  # as some GPTQ writers do
    save_file(tensors, files[0])
    q = load_model(out, "float32")
    assert type(q.model.layers[0].self_attn.qkv_proj).__name__ == "GPTQLinear"
    ref = logits(load_model(tiny_llama, "float32"))
    assert (logits(q) - ref).abs().max() < 0.1 * ref.abs().max()


def test_hugging_face_cache_layout_with_linked_files_loads(tiny_llama, tmp_path):
    # The HF hub cache links every snapshot file to ../../blobs/<hash>: the loader's "stay inside the folder"
    # and "regular files only" checks look at names and link targets' kinds, so this layout still loads.
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snap.mkdir(parents=True)
    tensors = load_file(tiny_llama / "model.safetensors")
    names = sorted(tensors)
    save_file({k: tensors[k] for k in names[:5]}, blobs / "a")
    save_file({k: tensors[k] for k in names[5:]}, blobs / "b")
    weight_map = {k: "model-00001-of-00002.safetensors" for k in names[:5]}
    weight_map |= {k: "model-00002-of-00002.safetensors" for k in names[5:]}
    (blobs / "index").write_text(json.dumps({"weight_map": weight_map}))
    links = {"model-00001-of-00002.safetensors": "a", "model-00002-of-00002.safetensors": "b",
             "model.safetensors.index.json": "index"}
    for f in tiny_llama.iterdir():
        shutil.copy(f, blobs / f.name)
        if f.name != "model.safetensors":
            links[f.name] = f.name
    for name, blob in links.items():
        (snap / name).symlink_to(f"../../blobs/{blob}")
    assert torch.equal(logits(load_model(snap, "float32")), logits(load_model(tiny_llama, "float32")))


@pytest.mark.parametrize("quant,expected", [
    ({"method": "gptq", "bits": 4, "group_size": 128}, "GPTQ int4, group 128"),
    ({"method": "rtn", "bits": 8, "group_size": -1}, "RTN int8, per channel"),
    ({"method": "awq", "sym": False}, "AWQ int4, group 128"),
    ({"method": "gptq", "format": "gptq_v2", "desc_act": True, "sym": False},
     "GPTQ int4, group 128, asymmetric, act-order, gptq_v2 format"),
    ({"method": "smoothquant"}, "SmoothQuant W8A8 (int8 weights, dynamic int8 activations)"),
])
def test_quantization_summary_says_method_bits_and_group(quant, expected):
    """What the engine's "loaded ..." line says of a quantized model (None: a dense one)."""
    from cinq.layers.quantization.format import QuantFormat
    from cinq.model.config import ModelConfig
    from cinq.model.loader import quantization_summary
    base = {"architectures": ["LlamaForCausalLM"], "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 1, "num_attention_heads": 2}
    assert quantization_summary(ModelConfig.from_dict(base)) is None
    config = ModelConfig.from_dict({**base, "quantization_config": QuantFormat(**quant).to_hf()})
    assert quantization_summary(config) == expected


_FIRST_LOAD = """
import sys, torch
from cinq.model.loader import load_model
load_model(sys.argv[1], "bfloat16")  # the first import of the model's modules happens inside this load
from cinq import LLM, SamplingParams
meta = sorted(f"{name}.{attr}" for name, mod in list(sys.modules.items()) if name.startswith("cinq")
              for attr, v in vars(mod).items() if isinstance(v, torch.Tensor) and v.device.type != "cpu")
params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
outs = LLM(sys.argv[1], dtype="bfloat16").generate([[3, 14, 15, 92, 65], [35, 89, 79]], params)
print(meta)
print([o.outputs[0].token_ids for o in outs])
"""


def test_a_first_load_leaves_no_module_tensor_on_meta(tiny_llama) -> None:
    # A model is built on the meta device; its family's modules, imported by the first load, used to make their
    # module-level tensors there too, and the fused decode step's meta tree mask then ran the attention's Meta
    # kernel (garbage tokens in every later bf16 engine of the process). A fresh interpreter: this one has them.
    import os
    import subprocess
    import sys

    from cinq import LLM, SamplingParams
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    want = [o.outputs[0].token_ids
            for o in LLM(tiny_llama, dtype="bfloat16").generate([[3, 14, 15, 92, 65], [35, 89, 79]], params)]
    env = {**os.environ, "CINQ_ENGINE_CORE": "inproc"}
    run = subprocess.run([sys.executable, "-c", _FIRST_LOAD, str(tiny_llama)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    meta, tokens = run.stdout.strip().splitlines()[-2:]
    assert meta == "[]"
    assert tokens == str(want)
