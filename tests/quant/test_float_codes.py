"""NF4 and FP8 folders end to end: a bitsandbytes checkpoint written by transformers loads in cinq with bitsandbytes'
values, and cinq's NF4 / compressed-tensors FP8 folders load in transformers with cinq's; a vLLM-layout FP8 folder
written independently here loads with its values; `cinq generate` serves every format."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from cinq.cli import main
from cinq.layers.quantization.fp8 import E4M3
from cinq.model.loader import load_model
from cinq.quant.config import QuantConfig
from cinq.quant.pipeline import quantize_model

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _cinq_weights(folder) -> dict[str, torch.Tensor]:
    """Each decoder projection's float32 weight as cinq serves it (float32: dequantized once at load), split back
    from the merged qkv / gate-up layers."""
    model = load_model(folder, dtype="float32")
    out = {}
    for i, layer in enumerate(model.model.layers):
        qkv = layer.self_attn.qkv_proj.weight
        gu = layer.mlp.gate_up_proj.weight
        c = model.config
        parts = dict(zip(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                         qkv.split([c.q_size, c.kv_size, c.kv_size])))
        parts.update(zip(("mlp.gate_proj", "mlp.up_proj"), gu.split([c.intermediate_size] * 2)))
        parts["self_attn.o_proj"], parts["mlp.down_proj"] = layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight
        out.update({f"model.layers.{i}.{k}": v for k, v in parts.items()})
    return out


def _hf_bnb_weights(model) -> dict[str, torch.Tensor]:
    import bitsandbytes.functional as bf
    out = {}
    for name, m in model.named_modules():
        if name.endswith(PROJ):
            out[name] = bf.dequantize_4bit(m.weight.data, m.weight.quant_state)  # in the state's dtype
    return out


@pytest.mark.parametrize("dq", [False, True], ids=["plain", "double_quant"])
def test_nf4_both_ways_with_transformers_and_bitsandbytes(dq, trained_tiny, tmp_path):
    pytest.importorskip("bitsandbytes")
    transformers = pytest.importorskip("transformers")
    warnings.filterwarnings("ignore")
    bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_use_double_quant=dq, bnb_4bit_compute_dtype=torch.bfloat16)
    hf = transformers.AutoModelForCausalLM.from_pretrained(trained_tiny, quantization_config=bnb, device_map="cpu")
    hf.save_pretrained(tmp_path / "theirs")
    assert "q_proj.weight.absmax" in " ".join(load_file(tmp_path / "theirs" / "model.safetensors"))
    ref = _hf_bnb_weights(hf)
    mine = _cinq_weights(tmp_path / "theirs")
    assert set(ref) == set(mine)
    for name, w in ref.items():  # bitsandbytes dequantizes to the weight's dtype: cinq's float32 values round to it
        assert torch.equal(mine[name].to(w.dtype), w), name
    quantize_model(trained_tiny, tmp_path / "ours", QuantConfig("nf4", group_size=64, double_quant=dq),
                   progress=False)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", device_map="cpu")
    assert type(back.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit"
    ours = _cinq_weights(tmp_path / "ours")
    for name, w in _hf_bnb_weights(back).items():
        assert torch.equal(ours[name].to(w.dtype), w), name


def test_fp8_vllm_layout_written_independently_loads_with_its_values(trained_tiny, tmp_path):
    """The layout vLLM's fp8 method loads (AutoFP8 / llm-compressor per-tensor): e4m3 weight, scalar weight_scale
    and input_scale per projection; config {quant_method: fp8, activation_scheme: static}."""
    dense = load_file(trained_tiny / "model.safetensors")
    out, expect = {}, {}
    for name, w in dense.items():
        if name.rsplit(".", 2)[-2] in PROJ and name.endswith(".weight"):
            scale = w.float().abs().amax() / 448.0
            q = (w.float() / scale).to(E4M3)
            out[name], out[name + "_scale"] = q, scale.reshape(())
            out[name.removesuffix("weight") + "input_scale"] = torch.tensor(0.05)
            expect[name.removesuffix(".weight")] = q.float() * scale
        else:
            out[name] = w
    folder = tmp_path / "fp8"
    folder.mkdir()
    save_file(out, str(folder / "model.safetensors"))
    cfg = json.loads((trained_tiny / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    (folder / "config.json").write_text(json.dumps(cfg))
    mine = _cinq_weights(folder)
    for name, w in expect.items():
        assert torch.equal(mine[name], w), name


@pytest.mark.parametrize("strategy,act", [("channel", "none"), ("tensor", "none"), ("channel", "dynamic"),
                                          ("tensor", "static")])
def test_compressed_tensors_fp8_loads_in_transformers_with_our_values(strategy, act, trained_tiny, calib_tokens,
                                                                      tmp_path):
    """transformers + compressed-tensors run the file (activations quantized as its config says, on the CPU) and
    give cinq's logits. (vLLM's own 'fp8' layout is not read by transformers on the CPU: its 'fp8' method is the
    block-wise FineGrainedFP8, which drops the per-tensor weight_scale.)"""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("compressed_tensors")
    warnings.filterwarnings("ignore")
    folder = tmp_path / "ct"
    cfg = QuantConfig("fp8", act_scheme=act, weight_strategy=strategy, format="compressed_tensors")
    quantize_model(trained_tiny, folder, cfg, calib_tokens[:4] if act == "static" else None, progress=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, device_map="cpu", dtype=torch.float32)
    ids = torch.tensor([[5, 17, 42, 9, 33, 61, 7, 12]])
    with torch.no_grad():
        ref = hf(ids).logits[0].float()  # compressed-tensors decompresses the e4m3 weights in its forward
        model = load_model(folder, dtype="float32")
        mine = model.compute_logits(model(ids))[0].float()
    assert (mine - ref).abs().max() <= 1e-4 * ref.abs().max()


@pytest.mark.parametrize("args", [["--method", "nf4", "--double-quant"], ["--method", "fp8"],
                                  ["--method", "fp8", "--weight-strategy", "channel", "--act-scheme", "none"]],
                         ids=["nf4", "fp8", "fp8_channel_weight_only"])
def test_generate_serves_the_float_code_folders(args, trained_tiny, tmp_path, capsys):
    folder = tmp_path / "q"
    assert main(["quantize", str(trained_tiny), *args, "--out", str(folder), "--no-eval", "--no-progress"]) == 0
    assert main(["generate", str(folder), "--prompt", "Question: Ben has 7 books.", "--max-tokens", "6",
                 "--temperature", "0"]) == 0
    assert "6 tokens" in capsys.readouterr().out


def test_chat_serves_an_fp8_folder_with_dynamic_activations(trained_tiny, tmp_path, monkeypatch, capsys):
    import io
    folder = tmp_path / "fp8"
    quantize_model(trained_tiny, folder, QuantConfig("fp8", act_scheme="dynamic"), progress=False)
    monkeypatch.setattr("sys.stdin", io.StringIO("Question: Ben has 7 books.\n\n"))
    assert main(["chat", str(folder), "--max-tokens", "5", "--temperature", "0", "--ignore-eos",
                 "--dtype", "bfloat16"]) == 0
    assert capsys.readouterr().out.strip()


@pytest.mark.slow
def test_bench_latency_on_an_nf4_folder_in_bf16(trained_tiny, tmp_path, capsys):
    """The native NF4 kernel path (bf16) through `cinq bench latency`, HF + bitsandbytes as its baseline."""
    pytest.importorskip("bitsandbytes")
    folder = tmp_path / "nf4"
    quantize_model(trained_tiny, folder, QuantConfig("nf4", group_size=64), progress=False)
    assert main(["bench", "latency", str(folder), "--input-lens", "8", "--output-len", "3", "--num-iters", "1",
                 "--dtype", "bfloat16", "--num-threads", "1", "--max-model-len", "128", "--no-progress",
                 "--out", str(tmp_path / "lat")]) == 0
    data = json.loads((tmp_path / "lat.json").read_text())
    assert [r["engine"].split()[0] for r in data["rows"]] == ["cinq", "HF"]
