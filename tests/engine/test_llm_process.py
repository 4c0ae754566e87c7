"""The offline LLM with its engine core in its own process gives what the in-process one gives (greedy tokens, stop
strings, n > 1, languages), and stops its core on shutdown."""

from __future__ import annotations

import pytest

from cinq import LLM, SamplingParams

PROMPTS = [[5, 72, 101, 108, 108, 111], [5, 119, 111, 114, 108, 100, 33], [5, 33, 34, 35]]


@pytest.mark.slow
def test_process_core_matches_the_in_process_engine(tiny_llama):
    args = {"dtype": "float32", "num_kv_blocks": 64, "block_size": 8}
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, n=2),
              SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)]
    ref = LLM(tiny_llama, **args)
    want = ref.generate(PROMPTS, params)
    stop_at = want[0].outputs[0].text[3:5]
    want_stop = ref.generate(PROMPTS[:1], params[0].clone(stop=[stop_at]))
    split = LLM(tiny_llama, engine_core="process", **args)
    try:
        got = split.generate(PROMPTS, params, language="de")
        got_stop = split.generate(PROMPTS[:1], params[0].clone(stop=[stop_at]))
        for g, w in zip(got + got_stop, want + want_stop):
            assert [(c.token_ids, c.text, c.finish_reason) for c in g.outputs] == \
                   [(c.token_ids, c.text, c.finish_reason) for c in w.outputs]
        # the same up to float32 rounding: the core may batch these requests differently (bucketed shapes)
        for g_pos, w_pos in zip(got[2].outputs[0].logprobs, want[2].outputs[0].logprobs):
            assert g_pos.keys() == w_pos.keys()
            assert all(g_pos[t].logprob == pytest.approx(w_pos[t].logprob, abs=1e-4) for t in g_pos)
        assert got_stop[0].outputs[0].finish_reason == "stop"
        stats = split.engine.get_stats()
        assert stats.generation_tokens >= 4 * 12  # as of the last step (the stop-string abort lands after it)
    finally:
        split.shutdown()
    assert not split.engine.client.proc.is_alive()
