"""End-to-end engine behaviour on a tiny model: batching, prefix caching, preemption, abort, errors."""

from __future__ import annotations

import random

import pytest

from cinq import LLM, SamplingParams
from cinq.errors import InvalidParameterError, PromptTooLongError

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def prompts(n: int, seed: int = 0, lo: int = 1, hi: int = 90) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 250) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def token_ids(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def reference(tiny_llama):
    """One-at-a-time greedy outputs (no batching, no prefix cache)."""
    llm = LLM(tiny_llama, dtype="float32", enable_prefix_caching=False, max_num_seqs=1)
    ps = prompts(12)
    return ps, [llm.generate([p], GREEDY)[0].outputs[0].token_ids for p in ps]


def test_continuous_batching_matches_one_at_a_time(tiny_llama, reference):
    ps, ref = reference
    llm = LLM(tiny_llama, dtype="float32", max_num_batched_tokens=24, block_size=8, num_kv_blocks=200)
    params = [GREEDY.clone(max_tokens=8 + i) for i in range(len(ps))]  # staggered finishes
    outs = llm.generate(ps, params)
    assert [t for t in token_ids(outs)] == [r[:8 + i] for i, r in enumerate(ref)]
    assert llm.engine.kv.num_free_blocks == 200


def test_prefix_caching_same_outputs_and_only_last_block_recomputed(tiny_llama, reference):
    ps, ref = reference
    llm = LLM(tiny_llama, dtype="float32", block_size=16)
    assert token_ids(llm.generate(ps, GREEDY)) == ref
    assert token_ids(llm.generate(ps, GREEDY)) == ref  # now served from the cache
    prompt = ps[0][:40] + [5] * (40 - len(ps[0][:40]))
    llm.generate([prompt], GREEDY)
    before = llm.engine.get_stats()
    out = llm.generate([prompt], GREEDY)[0]
    after = llm.engine.get_stats()
    assert out.num_cached_tokens == 32
    assert after.prompt_tokens - before.prompt_tokens == 8
    assert after.prefix_cache_hits - before.prefix_cache_hits == 32
    assert after.prefix_cache_queries - before.prefix_cache_queries == 40


def test_n_and_identical_prompts_share_blocks(tiny_llama):
    llm = LLM(tiny_llama, dtype="float32", block_size=4, num_kv_blocks=100)
    engine = llm.engine
    engine.add_request("x", list(range(3, 43)), SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=4))
    engine.step()
    tables = [engine.kv.block_ids(f"{i}_x") for i in range(3)]
    assert tables[0][:9] == tables[1][:9] == tables[2][:9]  # 39 of 40 prompt tokens' full blocks shared
    assert engine.kv.num_free_blocks == 100 - 10 - 2  # child 0 holds 10 blocks, the others 1 own block each
    while engine.has_unfinished_requests():
        outs = engine.step()
    assert len(outs[0].outputs) == 3 and all(len(c.token_ids) == 4 for c in outs[0].outputs)


def test_preemption_under_tiny_kv_budget_keeps_outputs_and_leaks_nothing(tiny_llama, reference):
    ps, ref = reference
    llm = LLM(tiny_llama, dtype="float32", block_size=4, num_kv_blocks=32, max_num_batched_tokens=64)
    outs = llm.generate(ps, GREEDY)
    assert token_ids(outs) == ref
    assert llm.engine.get_stats().num_preemptions > 0
    assert llm.engine.kv.num_free_blocks == 32
    assert all(b.ref_cnt == 0 for b in llm.engine.kv.pool.blocks)


def test_abort_frees_blocks(tiny_llama):
    llm = LLM(tiny_llama, dtype="float32", num_kv_blocks=50)
    engine = llm.engine
    engine.add_request("a", list(range(3, 60)), SamplingParams(max_tokens=100))
    engine.add_request("b", list(range(3, 20)), SamplingParams(max_tokens=100))
    engine.step()
    engine.step()
    assert engine.kv.num_free_blocks < 50
    engine.abort_request("a")
    engine.abort_request(["b"])
    assert engine.kv.num_free_blocks == 50 and not engine.has_unfinished_requests()
    assert engine.step() == []


def test_seeded_requests_repeat_regardless_of_batch_mates(tiny_llama):
    llm = LLM(tiny_llama, dtype="float32")
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    alone = llm.generate([[5, 6, 7]], p)[0].outputs[0].token_ids
    mates = [[9] * 20, [11, 12], [40] * 7]
    batched = llm.generate([mates[0], [5, 6, 7], mates[1], mates[2]],
                           [SamplingParams(temperature=1.0, max_tokens=16), p] + [SamplingParams()] * 2)
    assert batched[1].outputs[0].token_ids == alone
    other_seed = llm.generate([[5, 6, 7]], p.clone(seed=99))[0].outputs[0].token_ids
    assert other_seed != alone


def test_stop_strings_and_text(tiny_llama):
    llm = LLM(tiny_llama, dtype="float32")
    base = llm.generate(["hello"], GREEDY)[0].outputs[0]
    assert len(base.text) > 4
    stop = base.text[2:4]
    cut = llm.generate(["hello"], GREEDY.clone(stop=[stop]))[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == base.text[:base.text.index(stop)]
    kept = llm.generate(["hello"], GREEDY.clone(stop=[stop], include_stop_str_in_output=True))[0].outputs[0]
    assert kept.text == base.text[:base.text.index(stop) + len(stop)]


def test_chat_uses_template(tiny_llama):
    llm = LLM(tiny_llama, dtype="float32")
    out = llm.chat([{"role": "user", "content": "hi"}], GREEDY)[0]
    tok = llm.tokenizer
    assert out.prompt_token_ids == tok.encode("<|bos|><|user|>hi<|end|><|assistant|>", add_special_tokens=False)


@pytest.mark.parametrize("kwargs,param,words", [
    (dict(prompt=[5] * 597), "prompt", ["512", "597"]),
    (dict(prompt=[1, 2], max_tokens=600), "max_tokens", ["512", "602"]),
    (dict(prompt=[]), "prompt", ["empty"]),
    (dict(prompt=[1, 10**6]), "prompt", ["1000000", "263"]),
])
def test_bad_requests_rejected_with_numbers_and_engine_unharmed(tiny_llama, kwargs, param, words):
    llm = LLM(tiny_llama, dtype="float32")
    with pytest.raises((PromptTooLongError, InvalidParameterError)) as e:
        llm.generate([kwargs["prompt"]], SamplingParams(max_tokens=kwargs.get("max_tokens", 4)))
    assert e.value.param == param and all(w in str(e.value) for w in words)
    assert not llm.engine.has_unfinished_requests()
    assert llm.generate([[5, 6]], SamplingParams(max_tokens=3))[0].outputs[0].token_ids


def test_request_larger_than_cache_rejected_at_admission(tiny_llama):
    llm = LLM(tiny_llama, dtype="float32", num_kv_blocks=4, block_size=16)
    with pytest.raises(PromptTooLongError, match="4 blocks"):
        llm.generate([[7] * 57], SamplingParams(max_tokens=20))
    assert llm.engine.kv.num_free_blocks == 4


def test_prompt_logprobs_with_max_tokens_zero(tiny_llama):
    llm = LLM(tiny_llama, dtype="float32")
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=0, prompt_logprobs=2))[0]
    assert out.outputs[0].token_ids == [] and out.outputs[0].finish_reason == "length"
    assert out.prompt_logprobs[0] is None
    assert all(out.prompt_token_ids[i] in out.prompt_logprobs[i] for i in range(1, 4))
    assert all(len(d) in (2, 3) for d in out.prompt_logprobs[1:])
