"""Gemma 3 with the engine's features (tiny random Gemma 3, window 8 < the contexts): n-gram speculation and
tensor parallelism give the plain engine's greedy tokens; GPTQ and RTN quantize it into a folder that loads and
stays close; AWQ, SmoothQuant, EAGLE / Medusa heads and the compiled decode step are refused with an error
naming what is missing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cinq import LLM, SamplingParams
from cinq.errors import InvalidParameterError
from cinq.model.byte_tokenizer import save_byte_tokenizer
from cinq.model.config import ModelConfig
from cinq.model.saver import init_random_model, save_model
from tests.model.test_gemma3 import CFG

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = init_random_model(ModelConfig.from_dict(CFG), seed=11, std=0.3)  # loops under greedy decoding
    path = save_model(model, tmp_path_factory.mktemp("gemma3f") / "m")
    save_byte_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(4)
    return [torch.randint(3, 250, (n,), generator=gen).tolist() * 3 for n in (3, 5, 7)]


@pytest.fixture(scope="module")
def plain(folder: Path, prompts) -> list[list[int]]:
    llm = LLM(str(folder), dtype="float32", seed=0, block_size=4, num_kv_blocks=128)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]


def test_ngram_speculation_keeps_greedy_tokens(folder: Path, prompts, plain):
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    llm = LLM(str(folder), dtype="float32", seed=0, block_size=4, num_kv_blocks=128, speculative_config=spec)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == plain
    assert llm.engine.get_stats().spec_decode_num_accepted_tokens > 0  # the verify steps ran windowed


@pytest.mark.slow
def test_tensor_parallel_2_keeps_greedy_tokens(folder: Path, prompts, plain):
    llm = LLM(str(folder), dtype="float32", seed=0, block_size=4, num_kv_blocks=128, tensor_parallel_size=2)
    try:
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)] == plain
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_gptq_and_rtn_quantize_it(folder: Path, method: str, tmp_path: Path):
    from cinq.model.loader import load_model
    from cinq.quant.config import QuantConfig
    from cinq.quant.pipeline import quantize_model
    calib = torch.randint(3, 250, (8, 32), generator=torch.Generator().manual_seed(0))
    out = tmp_path / method
    quantize_model(folder, out, QuantConfig(method, 8, 32), calib if method == "gptq" else None, progress=False)
    ids = torch.randint(3, 250, (1, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        dense = load_model(folder, "float32")
        quant = load_model(out, "float32")
        a, b = dense.compute_logits(dense(ids)), quant.compute_logits(quant(ids))
    assert type(quant).__name__ == "Gemma3ForCausalLM"
    assert (a - b).abs().max() / a.abs().max() < 0.05  # int8 weights: close, not equal
    assert (a - b).abs().max() > 0


@pytest.mark.parametrize("method", ["awq", "smoothquant"])
def test_awq_and_smoothquant_are_refused_naming_the_norms(folder: Path, method: str, tmp_path: Path):
    from cinq.quant.config import QuantConfig
    from cinq.quant.pipeline import quantize_model
    cfg = QuantConfig("awq", 4, 32) if method == "awq" else QuantConfig("smoothquant", 8, -1)
    with pytest.raises(InvalidParameterError, match=f"Gemma3ForCausalLM does not support {method}.*norms"):
        quantize_model(folder, tmp_path / "q", cfg, torch.zeros(2, 8, dtype=torch.long), progress=False)


def test_eagle_heads_and_compile_are_refused(folder: Path):
    with pytest.raises(InvalidParameterError, match="Gemma3ForCausalLM does not support eagle"):
        LLM(str(folder), dtype="float32", num_kv_blocks=16,
            speculative_config={"method": "eagle", "model": str(folder), "num_speculative_tokens": 2})
    with pytest.raises(InvalidParameterError, match="Gemma3ForCausalLM does not support compile"):
        LLM(str(folder), dtype="float32", num_kv_blocks=16, compilation_config={"mode": 3})


def test_virtual_kv_layout_is_refused_naming_the_window(folder: Path):
    # The contiguous backend has no window mask: serving Gemma 3 there would attend past the window.
    with pytest.raises(InvalidParameterError, match="virtual' does not support sliding-window"):
        LLM(str(folder), dtype="float32", num_kv_blocks=16, kv_cache_layout="virtual")
