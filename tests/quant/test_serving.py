"""Quantized folders through the serving engine: generate, batching and prefix caching give the same greedy
tokens as a plain full-recompute loop over the same quantized model."""

from __future__ import annotations

import pytest
import torch

from cinq.quant.config import QuantConfig
from cinq.quant.pipeline import quantize_model

llm_module = pytest.importorskip("cinq.engine.llm")

PROMPTS = ["Question: Anna has 12 apples. Then Anna buys 5 more.\nSolution:\n",
           "Question: Ben has 7 books.\nSolution:\n",
           "Question: Carla has 30 coins. Then Carla loses 4. Then Carla finds 9 more.\nSolution:\n"]


def recompute_greedy(folder, prompt_ids: list[int], n: int) -> list[int]:
    from cinq.model.loader import load_model
    model = load_model(folder, dtype="float32")
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model.compute_logits(model(torch.tensor([ids]))[0, -1]).argmax()))
    return ids[len(prompt_ids):]


@pytest.mark.parametrize("cfg", [QuantConfig("gptq", 4, 32), QuantConfig("awq", 4, 32, sym=False),
                                 QuantConfig("smoothquant")], ids=["gptq", "awq", "w8a8"])
def test_engine_serves_quantized_folders(cfg, trained_tiny, calib_tokens, tmp_path):
    from cinq import LLM, SamplingParams
    folder = tmp_path / cfg.method
    quantize_model(trained_tiny, folder, cfg, calib_tokens[:8], progress=False)
    llm = LLM(str(folder), dtype="float32", num_kv_blocks=64, max_model_len=256, block_size=16)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    batched = llm.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, batched):
        ids = llm.tokenizer.encode(prompt)
        assert list(out.outputs[0].token_ids) == recompute_greedy(folder, ids, 12)
    # One at a time gives the batch's tokens; the repeated prompts hit the prefix cache.
    hits_before = llm.engine.kv.stats.hits
    single = [llm.generate([p], params)[0] for p in PROMPTS]
    assert [list(o.outputs[0].token_ids) for o in single] == [list(o.outputs[0].token_ids) for o in batched]
    assert llm.engine.kv.stats.hits > hits_before
