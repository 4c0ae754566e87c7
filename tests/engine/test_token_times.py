"""The one batch-1 decode timer: a token per step after the first, the engine left idle, the tokens greedy."""

from __future__ import annotations

from cinq.config import EngineConfig
from cinq.engine.engine import LLMEngine
from cinq.engine.token_times import TokenTimes, time_greedy_request
from cinq.sampling_params import SamplingParams


def test_one_gap_per_decode_step_and_the_greedy_tokens(tiny_llama):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", max_model_len=128))
    times = time_greedy_request(engine, [5, 6, 7, 8], 6)
    assert times.ttft_s > 0 and len(times.gaps_s) == 5 and all(g > 0 for g in times.gaps_s)
    assert not engine.has_unfinished_requests()
    engine.add_request("plain", [5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    outs = []
    while engine.has_unfinished_requests():
        outs = engine.step() or outs
    assert times.tokens == list(outs[-1].outputs[0].token_ids)
    assert times.decode_tokens_per_s == len(times.gaps_s) / sum(times.gaps_s)


def test_decode_rate_counts_only_the_tokens_after_the_first():
    assert TokenTimes(ttft_s=9.0, gaps_s=[0.1, 0.3]).decode_tokens_per_s == 2 / 0.4
    assert TokenTimes(ttft_s=0.5, gaps_s=[]).decode_tokens_per_s == 0.0
