"""Speculation on a quantized (int4, RTN g32) target: every proposer keeps greedy output identical to the same
quantized target decoding plainly, and a head trained for the dense target loads onto it (same embedding)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cinq import LLM, SamplingParams
from cinq.model.loader import load_model
from cinq.quant.config import QuantConfig
from cinq.quant.pipeline import quantize_model
from cinq.spec.eagle import new_eagle_head, save_eagle_head

PROMPTS = ["abcabcabc", "hello hello hello", "the cat and the cat and", "0101010101"]


@pytest.fixture(scope="module")
def int4_target(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("int4")
    quantize_model(tiny_llama, out, QuantConfig("rtn", 4, 32), None, progress=False)
    return out


@pytest.fixture(scope="module")
def eagle_for_dense(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    head = new_eagle_head(load_model(tiny_llama, torch.float32), "eagle", seed=2)
    return save_eagle_head(head, tmp_path_factory.mktemp("eagle-dense"))


def test_every_proposer_keeps_the_int4_targets_greedy_output(int4_target: Path, tiny_llama: Path,
                                                            eagle_for_dense: Path) -> None:
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in LLM(str(int4_target), dtype="float32").generate(PROMPTS, params)]
    for spec in ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
                 {"model": str(tiny_llama), "num_speculative_tokens": 3},  # the dense model drafting for its int4
                 {"method": "eagle", "model": str(eagle_for_dense), "num_speculative_tokens": 3}):
        llm = LLM(str(int4_target), dtype="float32", speculative_config=spec)
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == plain, spec
        st = llm.engine.get_stats()
        assert st.spec_decode_num_drafts > 0
        assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks
