"""n-gram speculation inside the continuous-batching engine: greedy output identical to speculation off (fp32),
through preemption, chunked prefill, prefix hits, stops and max_tokens mid-draft; blocks all free after."""

from __future__ import annotations

import pytest

from cinq import LLM, SamplingParams
from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.spec.config import SpeculativeConfig
from cinq.spec.drafter import NgramDrafter, SlotDrafter
from cinq.step.request import Request

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
# the tiny random model loops quickly under greedy decoding: n-gram lookups hit and most drafts are accepted
PROMPTS = ["abcabcabc", "hello hello hello", "xyz", "the cat and the cat and", "0101010101", "q"]


def run(model, spec: dict | None, params: list[SamplingParams], **engine_args) -> tuple[list[list[int]], LLM]:
    llm = LLM(str(model), dtype="float32", speculative_config=spec, **engine_args)
    outs = llm.generate(PROMPTS[:len(params)], params)
    return [o.outputs[0].token_ids for o in outs], llm


def greedy(n: int = 40, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


def test_greedy_output_is_unchanged_and_drafts_are_accepted(tiny_llama) -> None:
    params = [greedy() for _ in PROMPTS]
    plain, _ = run(tiny_llama, None, params)
    spec, llm = run(tiny_llama, NGRAM, params)
    assert spec == plain
    st = llm.engine.get_stats()
    assert st.spec_decode_num_drafts > 0 and st.spec_decode_num_accepted_tokens > 0
    assert st.spec_decode_num_accepted_tokens <= st.spec_decode_num_draft_tokens
    assert 1.0 < st.spec_decode_mean_acceptance_length <= 5.0
    per_pos = st.spec_decode_num_accepted_tokens_per_pos
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))  # a later draft is accepted only after earlier ones
    assert st.generation_tokens == sum(len(t) for t in spec)
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks


def test_unchanged_under_preemption_chunked_prefill_and_prefix_hits(tiny_llama) -> None:
    params = [greedy(60) for _ in range(4)] * 2
    prompts = PROMPTS[:4] * 2  # the repeats hit the prefix cache
    tight = dict(num_kv_blocks=24, block_size=4, max_num_batched_tokens=8)  # preempts, chunks every prompt

    def gen(spec):
        llm = LLM(str(tiny_llama), dtype="float32", speculative_config=spec, **tight)
        outs = llm.generate(prompts, params)
        return [o.outputs[0].token_ids for o in outs], llm

    plain, _ = gen(None)
    spec, llm = gen(NGRAM)
    assert spec == plain
    st = llm.engine.get_stats()
    assert st.num_preemptions > 0 and st.spec_decode_num_accepted_tokens > 0 and st.prefix_cache_hits > 0
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks


def test_stops_max_tokens_min_tokens_and_penalties_inside_a_draft(tiny_llama) -> None:
    plain, _ = run(tiny_llama, None, [greedy(40), greedy(40)])
    stop_tok = plain[1][17]  # prompt 1 stops there at the latest
    params = [greedy(23), greedy(40, stop_token_ids=[stop_tok]), greedy(40, min_tokens=30, stop_token_ids=[stop_tok])]
    a, _ = run(tiny_llama, None, params)
    b, llm = run(tiny_llama, NGRAM, params)
    assert a == b and len(b[0]) == 23 and b[1][-1] == stop_tok
    # a stop string completed inside an accepted draft: the same text and tokens as decoding one by one
    llm = LLM(str(tiny_llama), dtype="float32")
    text = llm.generate(PROMPTS[:1], [greedy(40)])[0].outputs[0].text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    with_stop = [greedy(40, stop=[stop])]
    a = LLM(str(tiny_llama), dtype="float32").generate(PROMPTS[:1], with_stop)[0].outputs[0]
    b = LLM(str(tiny_llama), dtype="float32", speculative_config=NGRAM).generate(PROMPTS[:1], with_stop)[0].outputs[0]
    assert (a.text, a.token_ids, a.finish_reason) == (b.text, b.token_ids, b.finish_reason) and a.finish_reason == "stop"
    # penalised requests alone: their verify rows must see the drafts before them as output history
    penalised = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, presence_penalty=0.3),
                 SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, frequency_penalty=0.1,
                                repetition_penalty=1.05)]
    a, _ = run(tiny_llama, None, penalised)
    b, llm = run(tiny_llama, NGRAM, penalised)
    assert a == b
    assert llm.engine.get_stats().spec_decode_num_accepted_tokens > 0
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks


def test_logprobs_are_the_targets_for_every_emitted_token(tiny_llama) -> None:
    params = [greedy(30, logprobs=2), greedy(30, logprobs=0)]
    llm_a = LLM(str(tiny_llama), dtype="float32")
    llm_b = LLM(str(tiny_llama), dtype="float32", speculative_config=NGRAM)
    a = llm_a.generate(PROMPTS[:2], params)
    b = llm_b.generate(PROMPTS[:2], params)
    assert llm_b.engine.get_stats().spec_decode_num_accepted_tokens > 0
    for x, y in zip(a, b):
        cx, cy = x.outputs[0], y.outputs[0]
        assert cx.token_ids == cy.token_ids and len(cy.logprobs) == len(cy.token_ids)
        assert cx.cumulative_logprob == pytest.approx(cy.cumulative_logprob, abs=1e-4)
        for px, py in zip(cx.logprobs, cy.logprobs):
            assert px.keys() == py.keys()
            assert all(px[t].logprob == pytest.approx(py[t].logprob, abs=1e-4) and px[t].rank == py[t].rank
                       for t in px)


def test_seeded_sampling_repeats_with_speculation(tiny_llama) -> None:
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=30, ignore_eos=True)] * 3
    first, _ = run(tiny_llama, NGRAM, params)
    again, _ = run(tiny_llama, NGRAM, params)
    assert first == again and all(len(t) == 30 for t in first)


def test_drafts_stay_inside_max_tokens_and_the_context() -> None:
    drafter = NgramDrafter(SpeculativeConfig.from_dict(NGRAM))
    req = Request("r", [1, 2, 3, 1, 2, 3, 1, 2], SamplingParams(), max_tokens=3, arrival_time=0.0)
    drafter.propose([req], max_model_len=100)
    assert req.spec_token_ids == [3, 1]  # 3 tokens left: 2 drafts + the step's own token
    req.max_tokens = 50
    drafter.propose([req], max_model_len=10)
    assert req.spec_token_ids == [3]  # 8 tokens of a 10-token context


def test_each_request_keeps_its_index_while_it_decodes_and_loses_it_when_it_leaves() -> None:
    drafter = NgramDrafter(SpeculativeConfig.from_dict(NGRAM))
    a = Request("a", [1, 2, 3, 1, 2], SamplingParams(), max_tokens=50, arrival_time=0.0)
    b = Request("b", [7, 8, 9], SamplingParams(), max_tokens=50, arrival_time=0.0)
    drafter.propose([a, b], max_model_len=100)
    index = drafter.lookup.indexes["a"]
    assert a.spec_token_ids == [3, 1, 2] and len(index) == 5
    a.all_token_ids += [3, 9, 1, 2]  # two steps' tokens
    drafter.propose([a], max_model_len=100)
    assert drafter.lookup.indexes["a"] is index and len(index) == 9  # extended, not rebuilt
    assert a.spec_token_ids == [3, 9, 1, 2] and set(drafter.lookup.indexes) == {"a"}  # b left: its index dropped
    a.all_token_ids = [4, 5, 4]  # not a continuation (never happens in the engine): indexed afresh
    drafter.propose([a], max_model_len=100)
    assert drafter.lookup.indexes["a"] is not index and a.spec_token_ids == [5, 4]


def test_prompt_lookup_first_gives_matches_their_drafts_and_the_rest_slots() -> None:
    config = {"method": "eagle3", "model": "head", "num_speculative_tokens": 3, "prompt_lookup_max": 2,
              "prompt_lookup_min": 1}
    drafter = SlotDrafter(SpeculativeConfig.from_dict(config))
    a = Request("a", [1, 2, 3, 1, 2], SamplingParams(), max_tokens=50, arrival_time=0.0)
    b = Request("b", [7, 8, 9], SamplingParams(), max_tokens=50, arrival_time=0.0)
    c = Request("c", [4, 5, 4], SamplingParams(), max_tokens=2, arrival_time=0.0)  # 1 draft left
    drafter.propose([a, b, c], max_model_len=100)
    assert (a.spec_token_ids, a.num_draft_slots) == ([3, 1, 2], 0)  # a copy of what followed "1 2"
    assert (b.spec_token_ids, b.num_draft_slots) == ([], 3)  # no match: the head's slots
    assert (c.spec_token_ids, c.num_draft_slots) == ([5], 0)
    plain = SlotDrafter(SpeculativeConfig.from_dict({k: v for k, v in config.items() if "lookup" not in k}))
    plain.propose([a, b], max_model_len=100)
    assert (a.spec_token_ids, a.num_draft_slots, b.num_draft_slots) == ([], 3, 3)


def test_missing_heads_and_bad_configs_are_refused(tiny_llama) -> None:
    with pytest.raises(ModelLoadError, match="neither a model folder") as err:
        LLM(str(tiny_llama), speculative_config={"method": "eagle", "model": "x", "num_speculative_tokens": 2})
    assert err.value.param == "speculative_config.model"
    with pytest.raises(InvalidParameterError) as err:
        LLM(str(tiny_llama), speculative_config={"method": "ngram", "num_speculative_tokens": 0,
                                                 "prompt_lookup_max": 2})
    assert err.value.param == "num_speculative_tokens"


def test_kv_accounting_after_many_speculative_requests_with_rejections_and_preemptions(tiny_llama) -> None:
    llm = LLM(str(tiny_llama), dtype="float32", speculative_config=NGRAM, num_kv_blocks=24, block_size=4,
              max_num_batched_tokens=64)
    prompts = [PROMPTS[i % len(PROMPTS)] + str(i % 7) for i in range(64)]
    # half greedy (the tiny model loops, so drafts get accepted), half sampled (drafts get rejected)
    params = [SamplingParams(temperature=0.9 * (i % 2), seed=i, max_tokens=8 + i % 17, ignore_eos=True)
              for i in range(64)]
    outs = llm.generate(prompts, params)
    st = llm.engine.get_stats()
    assert all(len(o.outputs[0].token_ids) == 8 + i % 17 for i, o in enumerate(outs))
    assert st.num_preemptions > 0
    assert st.spec_decode_num_draft_tokens > st.spec_decode_num_accepted_tokens > 0  # rejections happened
    assert llm.engine.kv.num_free_blocks == llm.engine.num_blocks
