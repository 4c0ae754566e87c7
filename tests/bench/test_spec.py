"""SpecOptions' limits (the speculative-decoding benchmark itself runs in tests/commands/test_bench.py)."""

from __future__ import annotations

import pytest

from cinq.bench.spec import SpecOptions
from cinq.errors import InvalidParameterError


@pytest.mark.parametrize("change", [{"batch_sizes": ()}, {"batch_sizes": (1, 0)}, {"num_prompts": 0},
                                    {"prompt_len": 0}, {"max_tokens": -1}])
def test_a_setting_out_of_its_limits_is_refused_by_name(change):
    with pytest.raises(InvalidParameterError) as e:
        SpecOptions(**change).validate()
    assert e.value.param == next(iter(change))


def test_the_defaults_pass():
    SpecOptions().validate()


def test_tokens_per_step_counts_every_forward_and_eos_can_end_a_request(tiny_llama):
    """A repetitive prompt (n-gram lookup drafts from its copies): tau counts the drafting steps only, tokens per
    step every forward, so it is at most tau; plain decoding gets exactly one token per forward."""
    from cinq.bench.spec import measure
    from cinq.config import EngineConfig
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 8]
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    spec = measure(EngineConfig(model=str(tiny_llama), speculative_config=ngram), prompts, 1, 12)
    assert spec["tokens"] == 24
    assert 1.0 <= spec["tokens_per_step"] <= spec["tau"]
    plain = measure(EngineConfig(model=str(tiny_llama)), prompts, 1, 12)
    assert plain["tokens_per_step"] == 1.0
    # decode: the tokens after each request's first over the time after each wave's first tokens. Here each wave is
    # one prefill forward then several decode forwards, so that span is most of the run, never all of it (with the
    # first-token times left out it would be all; read on another clock, next to nothing)
    for run in (spec, plain):
        assert 0.3 * run["seconds"] < (run["tokens"] - len(prompts)) / run["decode_tok_s"] < run["seconds"]
