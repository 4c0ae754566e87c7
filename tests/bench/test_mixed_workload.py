"""The mixed chat / code / arithmetic workload: seeded, mixed as asked, each kind behind a shared prefix."""

from __future__ import annotations

import pytest

from cinq.bench.mixed_workload import KINDS, MixedOptions, classify, mixed_workload
from cinq.errors import InvalidParameterError
from cinq.model.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return Tokenizer.from_pretrained(tiny_llama)


def test_same_seed_same_requests_and_every_kind_shares_a_prefix(tok):
    opts = MixedOptions(num_requests=12, output_len=(2, 5), seed=3)
    a, b = mixed_workload(tok, opts), mixed_workload(tok, MixedOptions(num_requests=12, output_len=(2, 5), seed=3))
    assert [r.prompt for r in a.requests] == [r.prompt for r in b.requests] and a.kinds == b.kinds
    assert len(a.requests) == 12 and set(a.kinds) <= set(KINDS) and sum(a.counts().values()) == 12
    assert all(2 <= r.output_len <= 5 for r in a.requests)
    for kind in KINDS:
        prompts = [r.prompt for r, k in zip(a.requests, a.kinds) if k == kind]
        if len(prompts) >= 2:  # the kind's shared prefix: the same first tokens
            assert prompts[0][:20] == prompts[1][:20] and prompts[0] != prompts[1]
    assert a.prefix_tokens_shared() > 0


def test_shares_choose_the_kinds(tok):
    only_code = mixed_workload(tok, MixedOptions(num_requests=5, shares=(0, 1, 0)))
    assert only_code.kinds == ["code"] * 5
    only_arith = mixed_workload(tok, MixedOptions(num_requests=3, shares=(0, 0, 1)))
    assert "Question:" in tok.decode(only_arith.requests[0].prompt)


def test_classify():
    assert classify("Question: Ann has 3 apples.") == "arithmetic"
    assert classify("def scan(s):\n    return s") == "code"
    assert classify("Wer nicht wagt, der nicht gewinnt.") == "chat"


@pytest.mark.parametrize("field, opts", [("num_requests", MixedOptions(num_requests=0)),
                                         ("shares", MixedOptions(shares=(0, 0, 0))),
                                         ("output_len", MixedOptions(output_len=(5, 2)))])
def test_bad_options_name_the_field(tok, field, opts):
    with pytest.raises(InvalidParameterError) as e:
        mixed_workload(tok, opts)
    assert e.value.param == field
