"""Quantized linears under tensor parallelism (TP = 2, gloo): int4 GPTQ (groups, act-order) and AWQ, int8 RTN
and W8A8 shard exactly (greedy tokens and fp32 logprobs as with one device); what cannot shard is refused."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from cinq import LLM, SamplingParams
from cinq.errors import InvalidParameterError
from cinq.layers.linear_split import column_split
from cinq.layers.quantization.linear import GPTQLinear
from cinq.quant.config import QuantConfig
from cinq.quant.pipeline import quantize_model

PROMPTS = ["hello world", "the quick brown fox jumps over"]
SCORED = SamplingParams(temperature=0, max_tokens=8, logprobs=5, ignore_eos=True)
ENGINE = dict(dtype="float32", num_kv_blocks=64, seed=1)

CASES = {  # name: (config, logprob tolerance against TP = 1)
    "gptq4-act-order": (QuantConfig("gptq", 4, 32, desc_act=True, format="gptq_v2", sym=False), 1e-4),
    "awq4": (QuantConfig("awq", 4, 32, sym=False), 1e-4),
    "rtn8-per-channel": (QuantConfig("rtn", 8, -1), 1e-4),
    "w8a8-static": (QuantConfig("smoothquant", act_scheme="static"), 1e-3),
    # dynamic per-token scales: each rank scales its own slice of the activations (finer): close, not equal
    "w8a8-dynamic": (QuantConfig("smoothquant"), 0.15),
}


def quantized(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    calib = torch.randint(3, 250, (4, 32), generator=torch.Generator().manual_seed(0))
    out = tmp_path_factory.mktemp(name)
    cfg = CASES[name][0]
    quantize_model(tiny_llama, out, cfg, None if cfg.method == "rtn" else calib, progress=False,
                   calib_dtype=torch.float32)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_quantized_tp2_matches_tp1(tiny_llama, tmp_path_factory, name):
    model = quantized(tiny_llama, tmp_path_factory, name)
    tol = CASES[name][1]
    ref = [o.outputs[0] for o in LLM(str(model), **ENGINE).generate(PROMPTS, SCORED)]
    llm = LLM(str(model), **ENGINE, tensor_parallel_size=2)
    try:
        down = llm.engine.model.model.layers[0].mlp.down_proj  # rank 0's row shard, quantized as in the file
        assert down.in_features == 64 and down.kind != "unloaded"
        got = [o.outputs[0] for o in llm.generate(PROMPTS, SCORED)]
    finally:
        llm.engine.shutdown()
    for r, g in zip(ref, got):
        if tol <= 1e-3:
            assert g.token_ids == r.token_ids
        first_r, first_g = r.logprobs[0], g.logprobs[0]  # the first step's scores see the same prompt
        for tok in set(first_r) & set(first_g):
            assert math.isclose(first_r[tok].logprob, first_g[tok].logprob, abs_tol=tol), (tok, name)
        if tol <= 1e-3:
            for a, b in zip(r.logprobs, g.logprobs):
                assert set(a) == set(b)
                assert all(math.isclose(a[t].logprob, b[t].logprob, abs_tol=tol) for t in a)


def test_three_bit_gptq_is_refused_under_tensor_parallelism():
    with pytest.raises(InvalidParameterError, match="3-bit GPTQ weights pack across word boundaries") as e:
        GPTQLinear(64, 64, False, 3, 32, compute_dtype=torch.float32,
                   split=column_split(0, 2, {None: 0}))
    assert e.value.param == "tensor_parallel_size"
