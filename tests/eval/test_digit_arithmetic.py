"""The addsub-1digit items: every single-digit sum and its inverse difference, each answer right."""

from __future__ import annotations

from cinq.eval.digit_arithmetic import addsub_items
from cinq.eval.fewshot import split_items


def test_items_are_all_sums_and_differences_with_right_answers():
    items = addsub_items()
    assert len(items) == 200 and len({it.question for it in items}) == 200
    for it in items:
        a, op, b, eq = it.question.split(" ")
        assert eq == "=" and op in "+-" and 0 <= int(b) <= 9
        assert int(it.answer) == (int(a) + int(b) if op == "+" else int(a) - int(b))
        assert 0 <= int(it.answer) <= 18 and (op == "+" or int(it.answer) <= 9)
    assert sum(it.question.split(" ")[1] == "-" for it in items) == 100


def test_test_split_holds_150_problems_of_both_kinds():
    test = split_items("addsub-1digit", addsub_items())["test"]
    assert len(test) == 150
    assert 50 < sum("+" in it.question for it in test) < 100
