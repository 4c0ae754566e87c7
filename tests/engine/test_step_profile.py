"""The start-up profile of the decode step by rows (cinq/engine/step_profile.py): an adaptive engine gets a curve
over every row count its steps can reach, the dummy steps write only the scratch blocks (a generation before and
after is the same, the pool stays free) and leave no request behind, with one KV pool or KV cache groups."""

from __future__ import annotations

from pathlib import Path

import pytest

from cinq import LLM, SamplingParams
from cinq.engine.step_profile import PROFILE_ROWS, profile_decode_rows, profile_rows
from tests.engine.test_kv_cache_groups import folder  # noqa: F401  (the fixture: full and sliding-window layers)

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "adaptive": True}


def test_profile_rows_reach_the_largest_step() -> None:
    assert profile_rows(8) == [1, 2, 4, 8]
    assert profile_rows(20) == [1, 2, 4, 8, 12, 16, 24]  # 24 >= 20: the curve reaches every step
    assert profile_rows(10_000) == list(PROFILE_ROWS)  # past the last: in proportion to rows


def test_an_adaptive_engine_is_profiled_over_its_steps_rows(tiny_llama: Path) -> None:
    llm = LLM(str(tiny_llama), dtype="float32", max_num_seqs=4, engine_core="inproc", speculative_config=NGRAM)
    curve = llm.engine.scheduler.drafter.adaptive.row_curve
    assert curve is not None and curve.rows == tuple(profile_rows(4 * (3 + 1)))
    assert all(s > 0 for s in curve.seconds)
    assert not llm.engine.executor.runner.states  # the dummy requests are gone
    plain = LLM(str(tiny_llama), dtype="float32", max_num_seqs=4, engine_core="inproc",
                speculative_config={**NGRAM, "adaptive": False})
    assert plain.engine.scheduler.drafter.adaptive is None  # a fixed k is not priced: no profile to pay for


@pytest.mark.parametrize("model", ["tiny_llama", "folder"])  # folder: a Gemma-3-like model, KV cache groups
def test_dummy_steps_touch_only_scratch_blocks(model: str, request: pytest.FixtureRequest) -> None:
    """A profile between two generations changes nothing they compute (its KV writes go to the scratch blocks
    past the pool, never a request's), and every block is free after."""
    llm = LLM(str(request.getfixturevalue(model)), dtype="float32", engine_core="inproc", block_size=4,
              num_kv_blocks=64)
    core = llm.engine
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    before = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    groups = getattr(core.kv, "full", None) is not None
    if groups:
        firsts = [core.kv.full.num_blocks, core.kv.sliding.num_blocks]
        got = profile_decode_rows(core.executor, [1, 3], [firsts[0]], [[b] for b in firsts])
    else:
        got = profile_decode_rows(core.executor, [1, 3], [core.num_blocks])
    assert set(got) == {1, 3} and all(s > 0 for s in got.values())
    assert not [rid for rid in core.executor.runner.states if rid.startswith("_profile")]
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == before
    assert core.kv.num_free_blocks == (core.kv.full.num_blocks if groups else core.num_blocks)
