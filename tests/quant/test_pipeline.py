"""`quantize_model` end to end: every method's folder loads with no flag through the model loader, its logits
stay close to the float model's, GPTQ beats RTN, and broken folders are clear errors naming the tensor."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.layers.quantization.linear import AWQLinear, GPTQLinear, W8A8Linear
from cinq.model.loader import load_model
from cinq.quant.config import QuantConfig
from cinq.quant.pipeline import quantize_model

CASES = {
    "rtn4": (QuantConfig("rtn", 4, 32), GPTQLinear, 0.4),
    "rtn8": (QuantConfig("rtn", 8, -1), GPTQLinear, 0.05),
    "gptq4": (QuantConfig("gptq", 4, 32), GPTQLinear, 0.3),
    "gptq4-act": (QuantConfig("gptq", 4, 32, desc_act=True, format="gptq_v2", sym=False), GPTQLinear, 0.3),
    "awq4": (QuantConfig("awq", 4, 32, sym=False), AWQLinear, 0.4),
    "w8a8": (QuantConfig("smoothquant"), W8A8Linear, 0.1),
    "w8a8-static": (QuantConfig("smoothquant", act_scheme="static"), W8A8Linear, 0.2),
}


@pytest.fixture(scope="module")
def float_logits(trained_tiny):
    from cinq.tasks import arithmetic_problems
    from cinq.model.byte_tokenizer import build_byte_tokenizer
    text = "".join(p.text() for p in arithmetic_problems(4, seed=11, split="test"))
    ids = torch.tensor(build_byte_tokenizer().encode(text, add_special_tokens=False).ids[:192]).unsqueeze(0)
    model = load_model(trained_tiny, dtype="float32")
    with torch.no_grad():
        return ids, model.compute_logits(model(ids))


@pytest.fixture(scope="module")
def quantized(trained_tiny, calib_tokens, tmp_path_factory):
    cache = {}

    def get(case: str):
        if case not in cache:
            cfg = CASES[case][0]
            out = tmp_path_factory.mktemp(case)
            cache[case] = (quantize_model(trained_tiny, out, cfg, calib_tokens, batch=8, progress=False), out)
        return cache[case]
    return get


def logits_of(folder, ids, dtype="float32"):
    model = load_model(folder, dtype=dtype)
    with torch.no_grad():
        return model, model.compute_logits(model(ids))


@pytest.mark.parametrize("case", list(CASES))
def test_quantized_folder_loads_with_no_flag_and_stays_close(case, quantized, float_logits):
    cfg, cls, tol = CASES[case]
    result, folder = quantized(case)
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert QuantConfig.from_hf(qc).format == cfg.format
    assert (folder / "tokenizer.json").is_file()
    ids, ref = float_logits
    model, logits = logits_of(folder, ids)
    linears = [m for m in model.modules() if isinstance(m, cls)]
    projections = sum(1 if m.output_shards is None else len(m.output_shards.ids) for m in linears)
    assert projections == 2 * 7  # every decoder linear, none left dense
    assert len(linears) == 2 * 4  # q/k/v and gate/up merged
    rel = float((logits - ref).abs().max() / ref.abs().max())
    agree = float((logits.argmax(-1) == ref.argmax(-1)).float().mean())
    assert rel < tol and agree > 0.9, (rel, agree)
    assert result.seconds > 0 and result.weight_bytes > 0


def test_gptq_logits_closer_than_rtn(quantized, float_logits):
    ids, ref = float_logits
    err = {}
    for case in ("rtn4", "gptq4"):
        _, logits = logits_of(quantized(case)[1], ids)
        err[case] = float((logits - ref).pow(2).mean())
    assert err["gptq4"] < err["rtn4"], err


def test_bf16_serving_dtype(quantized, float_logits):
    ids, ref = float_logits
    model, logits = logits_of(quantized("gptq4")[1], ids, dtype="bfloat16")
    assert next(m for m in model.modules() if isinstance(m, GPTQLinear)).kind in ("int4_native", "int4_cpu")
    assert float((logits - ref).abs().max() / ref.abs().max()) < 0.35


def test_sizes_shrink(quantized, trained_tiny):
    from cinq.eval.quant_quality import describe_folder
    _, _, dense = describe_folder(trained_tiny)
    assert describe_folder(quantized("rtn4")[1])[2] < describe_folder(quantized("rtn8")[1])[2] < dense


@pytest.mark.parametrize("edit,tensor", [({"bits": 8}, "qweight"), ({"group_size": 64}, "scales")])
def test_config_and_tensors_disagreeing_is_an_error_naming_the_tensor(quantized, tmp_path, edit, tensor):
    src = quantized("rtn4")[1]
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["quantization_config"].update(edit)
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError) as e:
        load_model(bad, dtype="float32")
    assert re.search(r"'model\.layers\.\d+\.\w+\.\w+\.(qweight|qzeros|scales)'", str(e.value))
    assert "shape" in str(e.value)
    if tensor == "qweight":  # bits 8 vs 4: qweight is the first tensor whose shape differs (K/4 vs K/8 rows)
        assert "qweight" in str(e.value)


def test_qkv_bias_model_and_sharded_output(random_tiny, calib_tokens, tmp_path):
    out = tmp_path / "sharded"
    res = quantize_model(random_tiny, out, QuantConfig("gptq", 4, 32, desc_act=True), calib_tokens[:4],
                         progress=False, max_shard_bytes=20_000)
    assert (out / "model.safetensors.index.json").is_file() and len(list(out.glob("model-*.safetensors"))) > 1
    assert res.weight_bytes > 0
    ref = load_model(random_tiny, dtype="float32")
    q = load_model(out, dtype="float32")
    ids = torch.randint(0, 250, (1, 24))
    with torch.no_grad():
        a, b = ref.compute_logits(ref(ids)), q.compute_logits(q(ids))
    assert float((a - b).abs().max() / a.abs().max()) < 0.5
    bias = q.model.layers[0].self_attn.qkv_proj.bias[: q.config.q_size]  # q_proj's rows
    assert float(bias.abs().sum()) > 0  # the Qwen2 q/k/v biases travelled (as fp16, like AutoGPTQ)


def test_refusals(trained_tiny, quantized, tmp_path):
    with pytest.raises(InvalidParameterError, match="calib"):
        quantize_model(trained_tiny, tmp_path / "x", QuantConfig("gptq", 4, 32), None, progress=False)
    with pytest.raises(ModelLoadError, match="already quantized"):
        quantize_model(quantized("rtn4")[1], tmp_path / "y", QuantConfig("rtn", 4, 32), None, progress=False)
    with pytest.raises(InvalidParameterError, match="group_size 48"):
        quantize_model(trained_tiny, tmp_path / "z", QuantConfig("rtn", 4, 48, format="awq"), None, progress=False)


def test_quantized_lm_head_round_trips(trained_tiny, tmp_path):
    from cinq.eval.quant_quality import describe_folder
    from tests.quant.conftest import tiny_config, train_tiny, write_folder
    with pytest.raises(InvalidParameterError, match="lm_head.*multiples of 8"):  # byte vocab: 263 rows
        quantize_model(trained_tiny, tmp_path / "x", QuantConfig("rtn", 4, 32, lm_head=True), None, progress=False)
    src = write_folder(train_tiny(tiny_config(vocab=264), steps=40), tmp_path / "src")
    ids = torch.tensor([[5, 80, 81, 82, 40, 41, 42, 43] * 8])
    dense = load_model(src, dtype="float32")
    with torch.no_grad():
        ref = dense.compute_logits(dense(ids))
    out = tmp_path / "head"
    quantize_model(src, out, QuantConfig("rtn", 4, 32, lm_head=True), None, progress=False)
    body_only = tmp_path / "body"
    quantize_model(src, body_only, QuantConfig("rtn", 4, 32), None, progress=False)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["lm_head"] is True and cfg["tie_word_embeddings"] is False
    assert json.loads((out / "quantize_config.json").read_text())["lm_head"] is True
    assert QuantConfig.from_hf(cfg["quantization_config"]).lm_head
    model, logits = logits_of(out, ids)
    assert isinstance(model.lm_head, GPTQLinear)
    assert torch.equal(model.model.embed_tokens.weight, dense.model.embed_tokens.weight)  # lookup stays exact
    rel = float((logits - ref).abs().max() / ref.abs().max())
    agree = float((logits.argmax(-1) == ref.argmax(-1)).float().mean())
    assert rel < 0.5 and agree > 0.85, (rel, agree)
    # Tied embeddings: the file keeps the dense embedding and adds the int4 head (under a third of a bf16 head),
    # which is what decode reads per step instead of the dense matrix.
    extra = describe_folder(out)[2] - describe_folder(body_only)[2]
    assert 0 < extra < 0.35 * 264 * 64 * 2


def test_lm_head_quantization_needs_a_gptq_format():
    for method in ("awq", "smoothquant"):
        with pytest.raises(InvalidParameterError, match="lm_head"):
            QuantConfig(method, lm_head=True)
    assert QuantConfig.from_hf(QuantConfig("gptq", 4, 32).to_hf()).lm_head is False
