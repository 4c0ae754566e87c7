"""Every task `cinq eval --tasks` names evaluates through one call; few-shot results read like arithmetic ones."""

from __future__ import annotations

import pytest

from cinq.errors import InvalidParameterError
from cinq.eval.standard_error import binomial_se
from cinq.eval.task_set import ALL_TASKS, FEWSHOT_TASKS, check_task, evaluate_fewshot, evaluate_task, first_prompt


def _oracle(wrong_every: int = 0):
    """A generator that answers each prompt's last question by computing it (wrong on every k-th prompt)."""
    calls = []

    def gen(prompts, max_new_tokens, stop):
        calls.append((len(prompts), max_new_tokens, tuple(stop)))
        outs = []
        for i, p in enumerate(prompts):
            a, op, b, _ = p.rsplit("\n", 1)[-1].split(" ")
            ans = int(a) + int(b) if op == "+" else int(a) - int(b)
            outs.append(f" {ans + (1 if wrong_every and i % wrong_every == 0 else 0)}\n9 + 9 = 18")
        return outs, 100.0
    return gen, calls


def test_fewshot_accuracy_se_and_outcomes_from_a_generator():
    gen, calls = _oracle()
    r = evaluate_fewshot("unused", "addsub-1digit", 150, generator=gen)
    assert r.accuracy == 1.0 and r.correct == [1] * 150 and r.n_steps == 0 and r.step_accuracy is None
    assert calls == [(150, 8, ("\n",))]
    gen, _ = _oracle(wrong_every=2)
    r = evaluate_fewshot("unused", "addsub-1digit", 150, generator=gen)
    assert r.accuracy == 0.5 and r.accuracy_se == pytest.approx(binomial_se(0.5, 150))
    assert r.correct[:4] == [0, 1, 0, 1] and len(r.samples) == 3 and r.samples[0]["prompt"].endswith("=")
    again = evaluate_task("unused", "addsub-1digit", 150, generator=gen).to_dict()
    assert {**again, "seconds": 0} == {**r.to_dict(), "seconds": 0}


def test_task_names_and_prompts():
    assert {"arithmetic", "arithmetic-easy", "addsub-1digit"} <= set(ALL_TASKS)
    assert set(FEWSHOT_TASKS) <= set(ALL_TASKS)
    assert first_prompt("addsub-1digit").count("\n") == 8 and first_prompt("addsub-1digit").endswith("=")
    assert first_prompt("arithmetic-easy").startswith("Question:")
    with pytest.raises(InvalidParameterError, match="addsub-1digit"):
        check_task("trivia")
    with pytest.raises(InvalidParameterError, match="150 test items"):
        evaluate_fewshot("unused", "addsub-1digit", 151, generator=_oracle()[0])
