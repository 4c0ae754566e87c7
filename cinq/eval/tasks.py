"""Deterministic multi-step arithmetic word problems with worked steps (the reasoning benchmark).

Each problem is a short story ("Anna has 12 apples. Then Anna buys 5 more. ...") whose solution is one
line per operation (``12 + 5 = 17``) and a final ``Answer: <int>`` line that an exact-match scorer reads.
The same generator feeds the training corpus (split "train"), chain-of-thought distillation, and the held-out
reasoning benchmark used by the quantization and distillation reports (split "test").

Two levels: ``standard`` (start 2-50, 2-4 steps, operands up to 30, values up to 500: the level in the
training corpus) and ``easy`` (start 2-20, 2-3 steps, operands 1-9 or 2, values up to 99), which a model of
cinq-tiny's size can learn from about a million tokens of fine-tuning, so that quantization's effect on reasoning
becomes measurable (cinq-tiny itself scores near chance on ``standard``).

Splits never overlap: a problem belongs to the split chosen by a hash of its question text, so no seed can
put the same question in two splits.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cinq.errors import InvalidParameterError

SPLITS = ("train", "validation", "test")
LEVELS = ("standard", "easy")
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
_EASY_MAX_VALUE = 99
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


def _make_problem(rng: random.Random) -> ArithmeticProblem:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    value = rng.randint(2, 50)
    sentences = [f"{name} has {value} {item}."]
    steps: list[str] = []
    for _ in range(rng.randint(2, 4)):
        # Pick among the operations that keep the value a small positive integer.
        ops = (["sub", "sub"] if value >= 2 else []) + (["add", "add"] if value < _MAX_VALUE else [])
        if value * 2 <= _MAX_VALUE:
            ops.append("mul")
        if any(value % k == 0 for k in range(2, 6)) and value >= 4:
            ops.append("div")
        op = rng.choice(ops)
        if op == "add":
            n = rng.randint(1, min(30, _MAX_VALUE - value))
            new, sym, tpl = value + n, "+", rng.choice(_ADD)
        elif op == "sub":
            n = rng.randint(1, value - 1)  # keep at least one: "has 0" questions read oddly
            new, sym, tpl = value - n, "-", rng.choice(_SUB)
        elif op == "mul":
            n = rng.choice([k for k in (2, 3, 4) if value * k <= _MAX_VALUE])
            new, sym, tpl = value * n, "*", rng.choice(_MUL)
        else:
            n = rng.choice([k for k in range(2, 6) if value % k == 0])
            new, sym, tpl = value // n, "/", rng.choice(_DIV)
        sentences.append(tpl.format(name=name, n=n))
        steps.append(f"{value} {sym} {n} = {new}")
        value = new
    sentences.append(f"How many {item} does {name} have now?")
    return ArithmeticProblem(" ".join(sentences), tuple(steps), value)


def _make_easy_problem(rng: random.Random) -> ArithmeticProblem:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    value = rng.randint(2, 20)
    sentences = [f"{name} has {value} {item}."]
    steps: list[str] = []
    for _ in range(rng.randint(2, 3)):
        ops = ["add", "sub"] if value >= 2 else ["add"]
        if value * 2 <= _EASY_MAX_VALUE:
            ops.append("mul")
        if value % 2 == 0 and value >= 4:
            ops.append("div")
        op = rng.choice(ops)
        if op == "add":
            n = rng.randint(1, min(9, _EASY_MAX_VALUE - value))
            new, sym, tpl = value + n, "+", rng.choice(_ADD)
        elif op == "sub":
            n = rng.randint(1, min(9, value - 1))
            new, sym, tpl = value - n, "-", rng.choice(_SUB)
        elif op == "mul":
            n, new, sym, tpl = 2, value * 2, "*", rng.choice(_MUL)
        else:
            n, new, sym, tpl = 2, value // 2, "/", rng.choice(_DIV)
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
    make = _make_problem if level == "standard" else _make_easy_problem
    out: list[ArithmeticProblem] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 100 * n + 1000:  # the problem space is far larger; this only guards a broken generator
            raise RuntimeError(f"arithmetic_problems: could not draw {n} distinct {split} problems")
        p = make(rng)
        if p.question in seen or _split_of(p.question) != split:
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


def step_accuracy(items: Sequence[StepItem], completions: Sequence[str]) -> float:
    """Fraction of items whose completion's first line is exactly the expected step (spaces trimmed)."""
    if len(items) != len(completions):
        raise InvalidParameterError(
            f"completions: got {len(completions)} for {len(items)} step items (must be equal)", "completions")
    if not items:
        raise InvalidParameterError("items must not be empty", "items")
    hits = sum(c.split("\n", 1)[0].strip() == it.expected for it, c in zip(items, completions))
    return hits / len(items)


def extract_answer(text: str) -> int | None:
    """The integer on the first ``Answer: <int>`` line of a completion, or None when there is none."""
    m = _ANSWER_RE.search(text)
    return int(m.group(1)) if m else None


def accuracy(problems: Sequence[ArithmeticProblem], completions: Sequence[str]) -> float:
    """Exact-match accuracy of the completions' extracted answers (a missing answer counts as wrong)."""
    if len(problems) != len(completions):
        raise InvalidParameterError(
            f"completions: got {len(completions)} for {len(problems)} problems (must be equal)", "completions")
    if not problems:
        raise InvalidParameterError("problems must not be empty", "problems")
    hits = sum(extract_answer(c) == p.answer for p, c in zip(problems, completions))
    return hits / len(problems)
