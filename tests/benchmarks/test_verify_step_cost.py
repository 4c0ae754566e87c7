"""The verify-step timer: every engine step is timed under the shape its scheduler gave it, plain steps at rows =
sequences, verify steps past them, and a step whose requests verify different numbers of drafts is marked ragged."""

from __future__ import annotations

import dataclasses

from benchmarks.verify_step_cost import StepTimes, shapes
from cinq.bench.spec import engine, measure
from cinq.config import EngineConfig


def test_steps_are_timed_by_shape_and_ragged_verifies_are_told_apart(tiny_llama) -> None:
    base = EngineConfig(model=str(tiny_llama), dtype="bfloat16", num_kv_blocks=64, seed=0)
    prompts = [[5, 6, 7, 8] * 4 + [5, 6], list(range(5, 17)), list(range(20, 29))]  # the first drafts at once
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    plain, ngram = engine(base), engine(dataclasses.replace(base, speculative_config=spec))
    times = {name: StepTimes(llm) for name, llm in (("plain", plain), ("ngram", ngram))}
    for llm in (plain, ngram):
        measure(llm, prompts, 3, 12)
    plain_shapes = shapes(times["plain"], 0, 1)
    assert plain_shapes and all(s["rows"] == s["seqs"] and not s["ragged"] for s in plain_shapes)
    assert sum(s["steps"] for s in plain_shapes) == sum(len(v) for k, v in times["plain"].times.items()
                                                         if k[0] == "decode")
    verify = [s for s in shapes(times["ngram"], 2, 1) if s["rows"] > s["seqs"]]
    assert any(s["ragged"] for s in verify)  # the looping prompt drafts beside ones without a match
    assert all(s["ragged"] == (s["rows"] != 3 * s["seqs"]) for s in verify)
    assert any(k[0] == "prefill" for k in times["ngram"].times)  # prefill steps are kept apart
