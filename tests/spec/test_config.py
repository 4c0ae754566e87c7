from __future__ import annotations

import pytest

from cinq.errors import InvalidParameterError
from cinq.spec.config import SpeculativeConfig


def test_vllm_style_dicts_parse() -> None:
    c = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})
    assert c.prompt_lookup_min == 3 and c.k_for_batch_size(1) == 4
    d = SpeculativeConfig.from_dict({"model": "draft-folder", "num_speculative_tokens": 2})
    assert d.method == "draft_model" and d.draft_sample_method == "greedy"
    assert c.lookup_first is False and d.lookup_first is False and d.prompt_lookup_min is None


def test_ngram_lookup_bounds_default_as_vllm() -> None:
    # neither bound: both 5; one bound: the other equals it (vLLM's SpeculativeConfig)
    bare = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2})
    assert (bare.prompt_lookup_min, bare.prompt_lookup_max) == (5, 5)
    low = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2})
    assert (low.prompt_lookup_min, low.prompt_lookup_max) == (2, 2)
    with pytest.raises(InvalidParameterError, match="prompt_lookup_min"):
        SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0})


def test_prompt_lookup_fields_with_a_model_method_put_lookup_first() -> None:
    c = SpeculativeConfig.from_dict({"method": "eagle3", "model": "head", "num_speculative_tokens": 3,
                                     "prompt_lookup_max": 4})
    assert c.lookup_first and (c.prompt_lookup_min, c.prompt_lookup_max) == (4, 4)
    d = SpeculativeConfig.from_dict({"model": "draft", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
                                     "prompt_lookup_min": 1})
    assert d.lookup_first and d.method == "draft_model" and d.prompt_lookup_min == 1
    # with a draft tree too: a request with a match verifies its copy as a chain, the others the head's tree
    t = SpeculativeConfig.from_dict({"method": "eagle3", "model": "head", "num_speculative_tokens": 6,
                                     "prompt_lookup_max": 3, "tree_topk": 2, "tree_depth": 3})
    assert t.lookup_first and t.tree_draft_depth == 3


def test_per_batch_size_ranges_override_k() -> None:
    c = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 2,
                                     "num_speculative_tokens_per_batch_size": [[9, 32, 0], [1, 8, 3]]})
    assert [c.k_for_batch_size(b) for b in (1, 8, 9, 32, 33)] == [3, 3, 0, 0, 5]


@pytest.mark.parametrize("d,param", [
    ({"num_speculative_tokens": 2}, "method"),
    ({"method": "medusa", "num_speculative_tokens": 2}, "model"),
    ({"method": "beam", "model": "x", "num_speculative_tokens": 2}, "method"),
    ({"method": "ngram", "prompt_lookup_max": 2}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0, "prompt_lookup_max": 2}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
     "prompt_lookup_max"),
    ({"model": "x", "num_speculative_tokens": 2, "draft_sample_method": "top"}, "draft_sample_method"),
    ({"model": "x", "num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[1, 8, 2], [8, 9, 1]]},
     "num_speculative_tokens_per_batch_size"),
    ({"model": "x", "num_speculative_tokens": 2, "k": 3}, "k"),
    ({"method": "eagle3", "model": "x", "num_speculative_tokens": 2, "prompt_lookup_max": 0}, "prompt_lookup_max"),
])
def test_invalid_configs_name_the_field(d: dict, param: str) -> None:
    with pytest.raises(InvalidParameterError) as err:
        SpeculativeConfig.from_dict(d)
    assert err.value.param == param
