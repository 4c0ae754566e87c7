"""Deterministic multi-step arithmetic word problems with worked steps (the reasoning benchmark).

Each problem is a short story ("Anna has 12 apples. Then Anna buys 5 more. ...") whose solution is one
line per operation (``12 + 5 = 17``) and a final ``Answer: <int>`` line that an exact-match scorer reads.
The same generator feeds the training corpus (split "train"), chain-of-thought distillation, and the held-out
reasoning benchmark used by the quantization and distillation reports (split "test").

Two levels: ``standard`` (start 2-50, 2-4 steps, operands up to 30, values up to 500: the level in the
training corpus) and ``easy`` (start 2-20, 2-3 steps, operands 1-9 or 2, values up to 99), which a model of
cinq-tiny's size can learn from about a million tokens of fine-tuning, so that quantization's effect on reasoning
becomes measurable (cinq-tiny itself scores near chance on ``standard``).

Splits never overlap: a problem belongs to the split chosen by a hash, so no seed can put it in two splits.
The standard level hashes the question text (the shipped corpus was built that way; about 5% of its test
problems share their exact chain of steps with some training problem). The easy level hashes the chain of
worked steps: its space is small enough that, split by wording, most test chains would also be training chains
under other names and items, and the benchmark would measure recall instead of arithmetic.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cinq.errors import InvalidParameterError

SPLITS = ("train", "validation", "test")
LEVELS = ("standard", "easy")  # see _LEVELS
TASKS = {"arithmetic": "standard", "arithmetic-easy": "easy"}  # task name (cinq eval --tasks) -> level
# Hash bucket (out of 10) -> split: 80% train, 10% validation, 10% test.
_BUCKETS = {"train": range(0, 8), "validation": range(8, 9), "test": range(9, 10)}

_NAMES = ("Anna", "Ben", "Carla", "David", "Emma", "Felix", "Grace", "Hugo", "Iris", "Jonas", "Kira", "Leo",
          "Mia", "Noah", "Olga", "Paul", "Rosa", "Sam", "Tara", "Victor")
_ITEMS = ("apples", "books", "coins", "pencils", "marbles", "stickers", "cookies", "stamps", "shells", "cards")
_ADD = ("Then {name} buys {n} more.", "Then a friend gives {name} {n} more.", "Then {name} finds {n} more.")
_SUB = ("Then {name} gives away {n}.", "Then {name} loses {n}.", "Then {name} sells {n}.")
_MUL = ("Then {name} gets {n} times as many.",)
_DIV = ("Then {name} splits them into {n} equal groups and keeps one group.",)
_MAX_VALUE = 500
_ANSWER_RE = re.compile(r"Answer:\s*(-?\d+)")


@dataclass(frozen=True, slots=True)
class ArithmeticProblem:
    """One word problem: the question, one worked step per operation, and the integer answer."""

    question: str
    steps: tuple[str, ...]
    answer: int

    def prompt(self) -> str:
        """The text given to the model; the completion should be ``target()``."""
        return f"Question: {self.question}\nSolution:\n"

    def target(self) -> str:
        """The worked solution: one line per step, then ``Answer: <int>``."""
        return "\n".join(self.steps) + f"\nAnswer: {self.answer}"

    def text(self) -> str:
        """Prompt and target as one training document."""
        return self.prompt() + self.target() + "\n"


def _split_of(question: str) -> str:
    bucket = int.from_bytes(hashlib.sha256(question.encode()).digest()[:4], "little") % 10
    return next(s for s, r in _BUCKETS.items() if bucket in r)


@dataclass(frozen=True, slots=True)
class _Level:
    """The knobs of one difficulty level (see the module docstring)."""

    start: tuple[int, int]
    num_steps: tuple[int, int]
    max_value: int
    max_add: int
    max_sub: int
    ops: tuple[str, ...]  # "add" / "sub" entries, repeated for weight, in the order drawn from
    mul_factors: tuple[int, ...]
    div_factors: tuple[int, ...]
    split_by_steps: bool  # the split hash covers the worked steps (True) or the question text (False)


_LEVELS = {
    "standard": _Level((2, 50), (2, 4), _MAX_VALUE, 30, _MAX_VALUE, ("sub", "sub", "add", "add"), (2, 3, 4),
                       (2, 3, 4, 5), False),
    "easy": _Level((2, 20), (2, 3), 99, 9, 9, ("add", "sub"), (2,), (2,), True),
}


def _pick(rng: random.Random, choices: list[int], factors: tuple[int, ...]) -> int:
    # A level with a single factor takes no draw (the easy level was defined that way); one with several always
    # draws, even from one remaining choice. Either way the problems of each level stay what they were.
    return choices[0] if len(factors) == 1 else rng.choice(choices)


def _make_problem(rng: random.Random, lv: _Level) -> ArithmeticProblem:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    value = rng.randint(*lv.start)
    sentences = [f"{name} has {value} {item}."]
    steps: list[str] = []
    for _ in range(rng.randint(*lv.num_steps)):
        # Pick among the operations that keep the value a small positive integer.
        ops = [op for op in lv.ops if (op == "sub" and value >= 2) or (op == "add" and value < lv.max_value)]
        if value * lv.mul_factors[0] <= lv.max_value:
            ops.append("mul")
        if any(value % k == 0 for k in lv.div_factors) and value >= 4:
            ops.append("div")
        op = rng.choice(ops)
        if op == "add":
            n = rng.randint(1, min(lv.max_add, lv.max_value - value))
            new, sym, tpl = value + n, "+", rng.choice(_ADD)
        elif op == "sub":
            n = rng.randint(1, min(lv.max_sub, value - 1))  # keep at least one: "has 0" questions read oddly
            new, sym, tpl = value - n, "-", rng.choice(_SUB)
        elif op == "mul":
            n = _pick(rng, [k for k in lv.mul_factors if value * k <= lv.max_value], lv.mul_factors)
            new, sym, tpl = value * n, "*", rng.choice(_MUL)
        else:
            n = _pick(rng, [k for k in lv.div_factors if value % k == 0], lv.div_factors)
            new, sym, tpl = value // n, "/", rng.choice(_DIV)
        sentences.append(tpl.format(name=name, n=n))
        steps.append(f"{value} {sym} {n} = {new}")
        value = new
    sentences.append(f"How many {item} does {name} have now?")
    return ArithmeticProblem(" ".join(sentences), tuple(steps), value)


def arithmetic_problems(n: int, seed: int = 0, split: str = "test", level: str = "standard"
                        ) -> list[ArithmeticProblem]:
    """``n`` distinct problems of ``split`` ("train" / "validation" / "test") at ``level`` ("standard" /
    "easy"), the same for the same seed."""
    if split not in SPLITS:
        raise InvalidParameterError(f"split must be one of {SPLITS}, got {split!r}", "split")
    if level not in LEVELS:
        raise InvalidParameterError(f"level must be one of {LEVELS}, got {level!r}", "level")
    if not isinstance(n, int) or isinstance(n, bool) or not (0 <= n <= 1_000_000):
        raise InvalidParameterError(f"n must be an integer in [0, 1000000], got {n!r}", "n")
    # The standard level keeps its original seed string: the shipped corpus and reports were drawn with it.
    rng = random.Random(f"cinq-arithmetic:{seed}:{split}" if level == "standard"
                        else f"cinq-arithmetic-{level}:{seed}:{split}")
    lv = _LEVELS[level]
    out: list[ArithmeticProblem] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 100 * n + 1000:  # the problem space is far larger; this only guards a broken generator
            raise RuntimeError(f"arithmetic_problems: could not draw {n} distinct {split} problems")
        p = _make_problem(rng, lv)
        key = "\n".join(p.steps) if lv.split_by_steps else p.question
        if p.question in seen or _split_of(key) != split:
            continue
        seen.add(p.question)
        out.append(p)
    return out


@dataclass(frozen=True, slots=True)
class StepItem:
    """One worked step to produce given the question and the correct steps before it (a "gold prefix")."""

    prompt: str
    expected: str


def step_items(problems: Sequence[ArithmeticProblem]) -> list[StepItem]:
    """Every step of every problem as its own item. Scoring steps under a gold prefix measures each operation
    (copying the operand, computing the result) on its own, so one early slip does not zero a whole problem:
    about three times as many scored items as problems, and a far less noisy signal on small models."""
    items = []
    for p in problems:
        for k, step in enumerate(p.steps):
            items.append(StepItem(p.prompt() + "".join(s + "\n" for s in p.steps[:k]), step))
    return items


def _check_scored(items: Sequence[object], completions: Sequence[str], field: str, what: str) -> None:
    """One completion per item, and at least one item: scoring an empty or misaligned list is a caller's bug."""
    if len(items) != len(completions):
        raise InvalidParameterError(
            f"completions: got {len(completions)} for {len(items)} {what} (must be equal)", "completions")
    if not items:
        raise InvalidParameterError(f"{field} must not be empty", field)


def step_accuracy(items: Sequence[StepItem], completions: Sequence[str]) -> float:
    """Fraction of items whose completion's first line is exactly the expected step (spaces trimmed)."""
    _check_scored(items, completions, "items", "step items")
    hits = sum(c.split("\n", 1)[0].strip() == it.expected for it, c in zip(items, completions))
    return hits / len(items)


def extract_answer(text: str) -> int | None:
    """The integer on the first ``Answer: <int>`` line of a completion, or None when there is none."""
    m = _ANSWER_RE.search(text)
    return int(m.group(1)) if m else None


def accuracy(problems: Sequence[ArithmeticProblem], completions: Sequence[str]) -> float:
    """Exact-match accuracy of the completions' extracted answers (a missing answer counts as wrong)."""
    _check_scored(problems, completions, "problems", "problems")
    hits = sum(extract_answer(c) == p.answer for p, c in zip(problems, completions))
    return hits / len(problems)
