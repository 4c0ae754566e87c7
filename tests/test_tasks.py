import re

import pytest

from cinq.errors import InvalidParameterError
from cinq.tasks import (ArithmeticProblem, accuracy, arithmetic_problems, extract_answer, step_accuracy,
                             step_items)

_STEP = re.compile(r"^(\d+) ([-+*/]) (\d+) = (\d+)$")


def test_same_seed_same_problems_and_seeds_differ():
    a = arithmetic_problems(50, seed=3, split="test")
    assert a == arithmetic_problems(50, seed=3, split="test")
    assert a != arithmetic_problems(50, seed=4, split="test")
    assert len({p.question for p in a}) == 50


def test_levels_differ_and_standard_is_unchanged_by_the_level_argument():
    standard = arithmetic_problems(20, seed=0, split="test")
    assert standard == arithmetic_problems(20, seed=0, split="test", level="standard")
    easy = arithmetic_problems(20, seed=0, split="test", level="easy")
    assert {p.question for p in easy}.isdisjoint(p.question for p in standard)
    with pytest.raises(InvalidParameterError, match="level"):
        arithmetic_problems(3, level="hard")


@pytest.mark.parametrize("level, digest", [
    ("standard", "118a1cec3d4e3ae1a8c2ba257f83fa3f23681e4f71d728e964836819e1742cf9"),
    ("easy", "2355285aba761f455edb75b50d281d9772f96352bcc29fa8c28044c66ac1f56b")])
def test_held_out_problems_never_change(level, digest):
    # The shipped models' cards and the committed reports were scored on exactly these problems.
    import hashlib
    text = "".join(p.text() for p in arithmetic_problems(300, seed=0, split="test", level=level))
    assert hashlib.sha256(text.encode()).hexdigest() == digest


def test_easy_test_chains_of_steps_never_appear_in_training():
    train = {p.steps for p in arithmetic_problems(5000, seed=0, split="train", level="easy")}
    assert not train & {p.steps for p in arithmetic_problems(500, seed=0, split="test", level="easy")}


def test_splits_never_overlap():
    sets = {s: {p.question for p in arithmetic_problems(400, seed=0, split=s)} for s in ("train", "validation", "test")}
    assert not sets["train"] & sets["validation"]
    assert not sets["train"] & sets["test"]
    assert not sets["validation"] & sets["test"]
    # Another seed's train split still avoids this seed's test split.
    other_train = {p.question for p in arithmetic_problems(400, seed=1, split="train")}
    assert not other_train & sets["test"]


@pytest.mark.parametrize("level, max_steps, max_operand, max_value", [("standard", 4, 500, 500), ("easy", 3, 9, 99)])
def test_worked_steps_are_correct_and_chain_to_the_answer(level, max_steps, max_operand, max_value):
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a // b}
    for p in arithmetic_problems(200, seed=7, split="train", level=level):
        assert 2 <= len(p.steps) <= max_steps
        start = int(re.search(r"has (\d+) ", p.question).group(1))
        value = start
        for step in p.steps:
            a, op, b, c = _STEP.match(step).groups()
            assert int(a) == value
            if op == "/":
                assert int(a) % int(b) == 0
            assert ops[op](int(a), int(b)) == int(c) >= 1
            assert int(b) <= max_operand and int(c) <= max_value
            value = int(c)
        assert value == p.answer
        assert p.target().endswith(f"\nAnswer: {p.answer}")
        assert extract_answer(p.target()) == p.answer
        assert p.text() == p.prompt() + p.target() + "\n"
        assert p.question in p.prompt() and "Answer:" not in p.prompt()


def test_extract_answer():
    assert extract_answer("3 + 4 = 7\nAnswer: 7") == 7
    assert extract_answer("Answer:12\nQuestion: ...\nAnswer: 5") == 12  # the first answer line counts
    assert extract_answer("Answer: -3") == -3
    assert extract_answer("3 + 4 = 7") is None
    assert extract_answer("Answer: seven") is None


def test_accuracy_counts_exact_matches():
    p = [ArithmeticProblem("q1", ("1 + 1 = 2",), 2), ArithmeticProblem("q2", ("2 + 2 = 4",), 4),
         ArithmeticProblem("q3", ("3 + 3 = 6",), 6), ArithmeticProblem("q4", ("4 + 4 = 8",), 8)]
    comps = ["Answer: 2", "Answer: 5", "no answer", "x\nAnswer: 8\nAnswer: 1"]
    assert accuracy(p, comps) == pytest.approx(0.5)
    with pytest.raises(InvalidParameterError, match="completions"):
        accuracy(p, comps[:3])
    with pytest.raises(InvalidParameterError, match="problems"):
        accuracy([], [])


def test_step_items_give_each_step_its_gold_prefix():
    p = ArithmeticProblem("Anna has 3 apples.", ("3 + 2 = 5", "5 * 2 = 10"), 10)
    items = step_items([p, ArithmeticProblem("q", ("1 + 1 = 2",), 2)])
    assert [it.expected for it in items] == ["3 + 2 = 5", "5 * 2 = 10", "1 + 1 = 2"]
    assert items[0].prompt == p.prompt()
    assert items[1].prompt == p.prompt() + "3 + 2 = 5\n"
    # every item's prompt followed by its step is a prefix of the full training text
    for it in items[:2]:
        assert p.text().startswith(it.prompt + it.expected)


def test_step_accuracy_scores_the_first_line_only():
    items = step_items([ArithmeticProblem("q", ("3 + 2 = 5", "5 * 2 = 10", "10 - 1 = 9", "9 / 3 = 3"), 3)])
    comps = [" 3 + 2 = 5 \nrubbish", "5 * 2 = 11", "\n10 - 1 = 9", "9 / 3 = 3"]
    assert step_accuracy(items, comps) == pytest.approx(0.5)
    with pytest.raises(InvalidParameterError, match="completions"):
        step_accuracy(items, comps[:2])
    with pytest.raises(InvalidParameterError, match="items"):
        step_accuracy([], [])


def test_bad_arguments_raise():
    with pytest.raises(InvalidParameterError, match="split"):
        arithmetic_problems(3, seed=0, split="dev")
    with pytest.raises(InvalidParameterError, match="n must"):
        arithmetic_problems(-1, seed=0, split="test")
    assert arithmetic_problems(0, seed=0, split="test") == []
