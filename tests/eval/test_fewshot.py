"""Few-shot exact-match tasks: exact, disjoint, deterministic splits; prompts built from train examples only;
a scorer that accepts exactly the answer (and a check that catches a scorer that does not)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from cinq.errors import InvalidParameterError
from cinq.eval.fewshot import FewShotItem, FewShotProblem, fewshot_problems, normalize, score, split_items

ITEMS = [FewShotItem(f"{a} + {b} =", str(a + b)) for a in range(10) for b in range(10)]


def test_splits_have_exact_sizes_are_disjoint_and_ignore_item_order():
    parts = split_items("t", ITEMS)
    assert {k: len(v) for k, v in parts.items()} == {"train": 20, "validation": 5, "test": 75}
    keys = [{it.key for it in v} for v in parts.values()]
    assert not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])
    assert split_items("t", list(reversed(ITEMS))) == parts
    assert split_items("other-task", ITEMS) != parts  # the hash is per task
    with pytest.raises(InvalidParameterError, match="distinct"):
        split_items("t", ITEMS + ITEMS[:1])


def test_problems_are_deterministic_and_examples_come_from_train_only():
    train = {it.key for it in split_items("t", ITEMS)["train"]}
    probs = fewshot_problems("t", ITEMS, 75, seed=0, split="test", shots=6)
    assert probs == fewshot_problems("t", ITEMS, 75, seed=0, split="test", shots=6)
    assert [p.item for p in probs] != [p.item for p in fewshot_problems("t", ITEMS, 75, seed=1, shots=6)]
    assert len({p.item.key for p in probs}) == 75 and not {p.item.key for p in probs} & train
    shots = {p.shots for p in probs}
    assert len(shots) == 1  # one shared prefix per seed (prefix caching)
    (examples,) = shots
    assert len(examples) == 6 and len({e.key for e in examples}) == 6 and {e.key for e in examples} <= train
    # Asked on the train split, a problem is never one of its own examples.
    for p in fewshot_problems("t", ITEMS, 14, split="train", shots=6):
        assert p.item not in p.shots
    with pytest.raises(InvalidParameterError, match="75 test items"):
        fewshot_problems("t", ITEMS, 76)
    with pytest.raises(InvalidParameterError, match="shots"):
        fewshot_problems("t", ITEMS, 3, shots=21)
    with pytest.raises(InvalidParameterError, match="split"):
        fewshot_problems("t", ITEMS, 3, split="dev")


def test_prompt_is_worked_examples_then_the_question():
    p = FewShotProblem(FewShotItem("4 + 3 =", "7"), (FewShotItem("3 + 5 =", "8"), FewShotItem("7 - 2 =", "5")))
    assert p.prompt() == "3 + 5 = 8\n7 - 2 = 5\n4 + 3 ="
    assert p.answer == "7"


# (completion, answer, right?) pairs a correct exact-match scorer must get right.
CASES = [(" 7", "7", True), ("7\n8 + 1 = 9", "7", True), (" Paris.", "Paris", True), (" Brasília.", "Brasilia", True), ("  7  \n", "7", True),
         (" 17", "7", False), (" 7 apples", "7", False), (" 1", "17", False), ("", "7", False), ("\n7", "7", False),
         (" paris", "Paris", False), (" Paris, France", "Paris", False)]


def scorer_failures(scorer: Callable[[Sequence[FewShotProblem], Sequence[str]], list[int]]) -> list[str]:
    """The CASES ``scorer`` gets wrong."""
    probs = [FewShotProblem(FewShotItem("q", a), ()) for _, a, _ in CASES]
    got = scorer(probs, [c for c, _, _ in CASES])
    return [f"{c!r} vs {a!r}" for (c, a, ok), g in zip(CASES, got) if bool(g) != ok]


def test_scorer_is_exact_match_on_the_first_line():
    assert scorer_failures(score) == []
    assert normalize(" Paris.\nNext") == "Paris"
    with pytest.raises(InvalidParameterError, match="completions"):
        score([FewShotProblem(ITEMS[0], ())], [])


def test_the_scorer_check_catches_a_broken_scorer():
    # A substring scorer (the classic bug) would credit "17" for 7 and "7 apples": the check must say so.
    def broken(problems, completions):
        return [int(p.answer in c) for p, c in zip(problems, completions)]
    failures = scorer_failures(broken)
    assert "' 17' vs '7'" in failures and "' 7 apples' vs '7'" in failures
