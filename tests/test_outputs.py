"""tau computed once: the function, the per-language stats and the engine's totals agree, 0 / None before a draft."""

from __future__ import annotations

from cinq.outputs import EngineStats, SpecDecodingStats, mean_acceptance_length


def test_tau_is_one_plus_accepted_per_verify_step() -> None:
    assert mean_acceptance_length(6, 4) == 2.5
    assert mean_acceptance_length(0, 0) is None
    s = SpecDecodingStats()
    assert s.mean_acceptance_length == 0.0
    s.observe(num_draft_tokens=4, num_accepted_tokens=3)
    s.observe(num_draft_tokens=4, num_accepted_tokens=0)
    assert s.mean_acceptance_length == 2.5
    e = EngineStats()
    assert e.spec_decode_mean_acceptance_length == 0.0
    e.spec_decode_num_drafts, e.spec_decode_num_accepted_tokens = 2, 3
    assert e.spec_decode_mean_acceptance_length == 2.5
