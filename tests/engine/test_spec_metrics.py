"""Speculative-decoding acceptance per language tag: requests tagged "de" / "py" (and untagged ones) under n-gram
speculation; each language's counters equal what its requests' RequestMetrics say, the totals are unchanged, and
bad tags are refused before anything is queued."""

from __future__ import annotations

import pytest

from cinq import LLM, SamplingParams
from cinq.engine.spec_metrics import MAX_LANGUAGES, OTHER_LANGUAGE, check_language, count_language
from cinq.errors import InvalidParameterError
from cinq.outputs import SpecDecodingStats

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
# repetitive prompts: the tiny random model loops under greedy decoding, so n-gram drafts hit and are accepted
PROMPTS = ["abcabcabc", "hello hello hello", "0101010101", "the cat and the cat and"]
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama) -> LLM:
    return LLM(str(tiny_llama), dtype="float32", speculative_config=NGRAM)


def test_per_language_counters_match_their_requests_and_sum_to_the_totals(llm) -> None:
    before = llm.engine.get_stats()
    assert before.spec_decode_by_language == {}
    outs = llm.generate(PROMPTS, GREEDY, language=["de", "py", "de", "py"])
    st = llm.engine.get_stats()
    by = st.spec_decode_by_language
    assert set(by) == {"de", "py"}
    for lang in by:
        mine = [o.metrics for o, tag in zip(outs, ["de", "py", "de", "py"]) if tag == lang]
        assert by[lang].num_drafts == sum(m.num_drafts for m in mine) > 0
        assert by[lang].num_draft_tokens == sum(m.num_draft_tokens for m in mine)
        assert by[lang].num_accepted_tokens == sum(m.num_accepted_tokens for m in mine) > 0
        tau = by[lang].mean_acceptance_length
        assert tau == 1 + by[lang].num_accepted_tokens / by[lang].num_drafts and 1 < tau <= 4
    # every request was tagged: the languages add up to the totals
    assert sum(c.num_drafts for c in by.values()) == st.spec_decode_num_drafts
    assert sum(c.num_draft_tokens for c in by.values()) == st.spec_decode_num_draft_tokens
    assert sum(c.num_accepted_tokens for c in by.values()) == st.spec_decode_num_accepted_tokens


def test_untagged_requests_count_in_the_totals_only_and_outputs_do_not_change(llm, tiny_llama) -> None:
    plain = LLM(str(tiny_llama), dtype="float32", speculative_config=NGRAM)
    untagged = plain.generate(PROMPTS, GREEDY)
    assert plain.engine.get_stats().spec_decode_by_language == {}
    before = llm.engine.get_stats()
    outs = llm.generate(PROMPTS, GREEDY, language=[None, "de", None, None])
    after = llm.engine.get_stats()
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in untagged]
    drafts = after.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens
    assert drafts == sum(o.metrics.num_draft_tokens for o in outs)  # the totals count every request, as before
    de = after.spec_decode_by_language["de"].num_draft_tokens - before.spec_decode_by_language["de"].num_draft_tokens
    assert de == outs[1].metrics.num_draft_tokens
    assert after.spec_decode_by_language.keys() == before.spec_decode_by_language.keys()


def test_n_children_count_under_their_parents_language(llm) -> None:
    before = llm.engine.get_stats().spec_decode_by_language.get("nn", SpecDecodingStats())
    (out,) = llm.generate(PROMPTS[:1], GREEDY.clone(n=2), language="nn")
    after = llm.engine.get_stats().spec_decode_by_language["nn"]
    assert after.num_drafts - before.num_drafts == out.metrics.num_drafts > 0
    assert after.num_accepted_tokens - before.num_accepted_tokens == out.metrics.num_accepted_tokens


def test_a_snapshot_does_not_move_when_the_engine_counts_on(llm) -> None:
    llm.generate(PROMPTS[:1], GREEDY, language="snap")
    snap = llm.engine.get_stats()
    frozen = (snap.spec_decode_by_language["snap"].num_drafts, list(snap.spec_decode_num_accepted_tokens_per_pos))
    llm.generate(PROMPTS[:1], GREEDY, language="snap")
    assert (snap.spec_decode_by_language["snap"].num_drafts, snap.spec_decode_num_accepted_tokens_per_pos) == frozen
    assert llm.engine.get_stats().spec_decode_by_language["snap"].num_drafts > frozen[0]


@pytest.mark.parametrize("bad", ["", "x" * 33, "de DE", "ü", "a/b", 5])
def test_bad_tags_are_refused_before_anything_is_queued(llm, bad) -> None:
    with pytest.raises(InvalidParameterError) as err:
        llm.generate(PROMPTS[:2], GREEDY, language=["de", bad])
    assert err.value.param == "language"
    with pytest.raises(InvalidParameterError) as err:
        llm.engine.add_request("bad-tag", "x", GREEDY, language=bad)
    assert err.value.param == "language"
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(InvalidParameterError, match="2 prompts"):
        llm.generate(PROMPTS[:2], GREEDY, language=["de"])


def test_tags_past_the_cap_share_one_label() -> None:
    assert check_language("de-CH_1") == "de-CH_1" and check_language(None) is None
    by: dict[str, SpecDecodingStats] = {}
    for i in range(MAX_LANGUAGES + 10):
        count_language(by, f"l{i}", 3, 1)
    assert len(by) == MAX_LANGUAGES and by[OTHER_LANGUAGE].num_drafts == 11
    count_language(by, "l0", 3, 2)  # a tag already counted keeps its own series
    assert by["l0"].num_drafts == 2 and by["l0"].num_accepted_tokens == 3
