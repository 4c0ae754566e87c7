"""The one arithmetic benchmark: scoring whole problems and steps, SEs, per-problem outcomes, both generators."""

from __future__ import annotations

import pytest

from cinq.errors import InvalidParameterError
from cinq.eval.arithmetic import STEP_STOP, WHOLE_STOP, evaluate_arithmetic, score
from cinq.eval.generation import NaiveGenerator
from cinq.eval.standard_error import binomial_se, cluster_ratio_se
from cinq.tasks import arithmetic_problems, step_items


def test_scores_and_ses_from_known_completions(trained_tiny):
    problems = arithmetic_problems(6, seed=3, split="test", level="easy")
    calls = []

    def generate(prompts, max_new_tokens, stop):
        calls.append((len(prompts), max_new_tokens, tuple(stop)))
        if tuple(stop) == WHOLE_STOP:  # problems 0 and 3 answered wrong
            return [p.target() if i not in (0, 3) else "1 + 1 = 2\nAnswer: 999" for i, p in
                    enumerate(problems)], 5.0
        items = step_items(problems)  # every first step wrong, the rest right (and extra lines ignored)
        firsts = {i for i, it in enumerate(items) if it.prompt.endswith("Solution:\n")}
        return ["0 + 0 = 1" if i in firsts else it.expected + "\nnoise" for i, it in enumerate(items)], 5.0
    r = evaluate_arithmetic(trained_tiny, "arithmetic-easy", 6, seed=3, generator=generate)
    assert calls == [(6, 96, WHOLE_STOP), (len(step_items(problems)), 16, STEP_STOP)]
    assert r.correct == [0, 1, 1, 0, 1, 1] and r.accuracy == pytest.approx(4 / 6)
    assert r.accuracy_se == pytest.approx(binomial_se(4 / 6, 6))
    counts = [len(p.steps) for p in problems]
    assert r.step_counts == counts and r.step_hits == [c - 1 for c in counts]
    assert r.step_accuracy == pytest.approx(sum(c - 1 for c in counts) / sum(counts))
    assert r.step_accuracy_se == pytest.approx(cluster_ratio_se(r.step_hits, counts))
    assert r.step_accuracy_se_simple == pytest.approx(binomial_se(r.step_accuracy, sum(counts)))
    assert len(r.samples) == 3 and r.samples[0]["answer"] == problems[0].answer
    assert r.to_dict()["n_steps"] == sum(counts)


def test_real_greedy_generation_naive_and_engine_agree(trained_tiny):
    naive = evaluate_arithmetic(trained_tiny, "arithmetic", 3, seed=2, generator="naive", dtype="float32")
    engine = evaluate_arithmetic(trained_tiny, "arithmetic", 3, seed=2, generator="engine", dtype="float32")
    assert naive.correct == engine.correct and naive.step_hits == engine.step_hits
    assert [s["completion"] for s in naive.samples] == [s["completion"] for s in engine.samples]


def test_naive_generator_cuts_at_stop_strings(trained_tiny):
    gen = NaiveGenerator.from_folder(trained_tiny, dtype="float32")
    texts, tps = gen(["Question: Anna has 3 apples."] * 2, 12, ("\n",))
    assert len(texts) == 2 and all("\n" not in t for t in texts) and tps > 0


def test_bad_arguments():
    with pytest.raises(InvalidParameterError):
        evaluate_arithmetic("x", "algebra", 3)
    with pytest.raises(InvalidParameterError):
        score(arithmetic_problems(2), ["a"], [])
