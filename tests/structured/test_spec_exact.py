"""Constrained decoding under speculation: greedy output identical to speculation off (fp32) for every proposer
(n-gram, draft model, EAGLE, Medusa), the output inside the grammar, and drafts the grammar forbids rejected."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from cinq import LLM, SamplingParams, StructuredOutputsParams
from cinq.model.loader import load_model
from cinq.spec.eagle import new_eagle_head, save_eagle_head
from cinq.spec.medusa import new_medusa_heads, save_medusa_heads
from tests.model_factory import build_tiny_model

PROMPTS = ["abcabcabc", "hello hello hello", "the cat and the cat and", "0101010101"]
REGEX = r"(abc|hello |the cat and |01)+\."
SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 6},
                                           "b": {"type": "array", "items": {"enum": ["abc", "hello"]},
                                                 "maxItems": 3}},
          "required": ["a", "b"], "additionalProperties": False}


@pytest.fixture(scope="module")
def proposers(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    target = load_model(tiny_llama, torch.float32)
    torch.manual_seed(0)
    eagle = new_eagle_head(target, "eagle", seed=1)
    medusa = new_medusa_heads(target, num_heads=3)
    with torch.no_grad():
        for p in list(eagle.parameters()) + list(medusa.parameters()):
            if p.dim() == 2:
                p.add_(torch.randn_like(p) * 0.3)
    draft = build_tiny_model(tmp_path_factory.mktemp("draft"), "qwen3", seed=7)
    k = {"num_speculative_tokens": 3}
    return {
        "ngram": {"method": "ngram", "prompt_lookup_max": 3, "prompt_lookup_min": 1, **k},
        "draft_self": {"model": str(tiny_llama), **k},  # the target as its own draft: drafts all plausible
        "draft_other": {"model": str(draft), **k},
        "eagle": {"method": "eagle", "model": str(save_eagle_head(eagle, tmp_path_factory.mktemp("eagle"))), **k},
        "medusa": {"method": "medusa", "model": str(save_medusa_heads(medusa, tmp_path_factory.mktemp("med"))), **k},
    }


def _params(spec: StructuredOutputsParams) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=40, structured_outputs=spec)


@pytest.mark.parametrize("name", ["ngram", "draft_self", "draft_other", "eagle", "medusa"])
def test_greedy_constrained_output_is_unchanged_by_speculation(tiny_llama: Path, proposers, name: str) -> None:
    specs = [StructuredOutputsParams(regex=REGEX), StructuredOutputsParams(json=SCHEMA)]
    params = [_params(specs[i % 2]) for i in range(len(PROMPTS))]
    plain = LLM(str(tiny_llama), dtype="float32").generate(PROMPTS, params)
    llm = LLM(str(tiny_llama), dtype="float32", speculative_config=proposers[name])
    spec = llm.generate(PROMPTS, params)
    assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in plain]
    stats = llm.engine.get_stats()
    assert stats.spec_decode_num_draft_tokens > 0
    for i, o in enumerate(plain):
        text, done = o.outputs[0].text, o.outputs[0].finish_reason == "stop"
        if i % 2 == 0:  # a regex prefix while unfinished, a full match when the grammar closed
            assert re.fullmatch(REGEX, text) if done else re.match(r"(abc|hello |the cat and |01)*", text)
        elif done:
            assert set(json.loads(text)) == {"a", "b"}
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks


def test_forbidden_drafts_are_rejected(tiny_llama: Path, proposers) -> None:
    """n-gram drafts copy the prompt; a choice grammar forbids most of them: the verifier rejects those, and
    the output is still one of the choices."""
    params = SamplingParams(temperature=0, max_tokens=20,
                            structured_outputs=StructuredOutputsParams(choice=["abcabx", "hello world"]))
    llm = LLM(str(tiny_llama), dtype="float32", speculative_config=proposers["ngram"])
    outs = llm.generate(PROMPTS, params)
    assert all(o.outputs[0].text in ("abcabx", "hello world") for o in outs)
    st = llm.engine.get_stats()
    assert st.spec_decode_num_draft_tokens > st.spec_decode_num_accepted_tokens
