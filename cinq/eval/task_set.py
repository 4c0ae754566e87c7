"""The tasks `cinq eval --tasks NAME` can name, and one call that evaluates a model folder on any of them.

Two kinds: the arithmetic word problems with worked steps (cinq.tasks / cinq.eval.arithmetic: accuracy and
step accuracy) and the few-shot exact-match tasks (cinq.eval.fewshot: accuracy only; a one-line answer has no
steps, so its step columns stay empty). Both return the fields the quality report reads, under the same names.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cinq.errors import InvalidParameterError
from cinq.eval.arithmetic import ArithmeticResult, evaluate_arithmetic, make_generator
from cinq.eval.fewshot import MAX_NEW_TOKENS, STOP, FewShotItem, fewshot_problems, score
from cinq.eval.generation import GenerateFn
from cinq.eval.standard_error import binomial_se
from cinq.tasks import TASKS as ARITHMETIC_TASKS
from cinq.tasks import arithmetic_problems

FEWSHOT_SHOTS = 8  # examples before each problem


def _addsub() -> list[FewShotItem]:
    from cinq.eval.digit_arithmetic import addsub_items
    return addsub_items()


def _capitals() -> list[FewShotItem]:
    from cinq.eval.capitals import capital_items
    return capital_items()


# task name -> its items (loaded on use: the capitals read a data file)
FEWSHOT_TASKS: dict[str, Callable[[], list[FewShotItem]]] = {"addsub-1digit": _addsub, "capitals": _capitals}
ALL_TASKS = (*ARITHMETIC_TASKS, *FEWSHOT_TASKS)


@dataclass(slots=True)
class FewShotResult:
    """Accuracy on ``n_problems`` few-shot problems with its binomial SE, timing and per-problem outcomes; the
    step fields exist (empty) so that every task's result reads the same."""

    task: str
    split: str
    seed: int
    n_problems: int
    accuracy: float
    accuracy_se: float
    seconds: float
    tokens_per_s: float
    shots: int = FEWSHOT_SHOTS
    correct: list[int] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    n_steps: int = 0
    step_accuracy: float | None = None
    step_accuracy_se: float | None = None
    step_hits: list[int] = field(default_factory=list)
    step_counts: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_task(task: str) -> None:
    """InvalidParameterError unless ``task`` is one of ALL_TASKS."""
    if task not in ALL_TASKS:
        raise InvalidParameterError(f"task must be one of {', '.join(ALL_TASKS)}, got {task!r}", "task")


def evaluate_fewshot(model_dir: str | Path, task: str, n: int = 150, seed: int = 0, split: str = "test",
                     generator: str | GenerateFn = "engine", dtype: str = "bfloat16", model: Any = None,
                     shots: int = FEWSHOT_SHOTS, n_samples: int = 3) -> FewShotResult:
    """Greedy exact-match accuracy of ``model_dir`` on ``n`` problems of the few-shot ``task``."""
    if task not in FEWSHOT_TASKS:
        raise InvalidParameterError(f"task must be one of {sorted(FEWSHOT_TASKS)}, got {task!r}", "task")
    if not isinstance(n, int) or n < 1:
        raise InvalidParameterError(f"n must be a positive integer, got {n!r}", "n")
    problems = fewshot_problems(task, FEWSHOT_TASKS[task](), n, seed, split, shots)
    gen = make_generator(model_dir, generator, dtype, model)
    start = time.perf_counter()
    completions, tps = gen([p.prompt() for p in problems], MAX_NEW_TOKENS, STOP)
    seconds = time.perf_counter() - start
    correct = score(problems, completions)
    acc = sum(correct) / n
    samples = [{"prompt": p.prompt(), "completion": c, "answer": p.answer}
               for p, c in zip(problems[:n_samples], completions[:n_samples])]
    return FewShotResult(task, split, seed, n, acc, binomial_se(acc, n), seconds, tps, shots, correct, samples)


def evaluate_task(model_dir: str | Path, task: str, n: int, seed: int = 0, split: str = "test",
                  generator: str | GenerateFn = "engine", dtype: str = "bfloat16", model: Any = None,
                  max_new_tokens: int = 96) -> ArithmeticResult | FewShotResult:
    """``model_dir`` evaluated on ``n`` problems of any task (``max_new_tokens``: the word problems' budget;
    few-shot answers are one short line)."""
    check_task(task)
    if task in FEWSHOT_TASKS:
        return evaluate_fewshot(model_dir, task, n, seed, split, generator, dtype, model)
    return evaluate_arithmetic(model_dir, task, n, seed, split, generator, dtype, model, max_new_tokens)


def first_prompt(task: str, seed: int = 0, split: str = "test") -> str:
    """The prompt of the task's first problem (the batch-1 decode timing runs on it)."""
    check_task(task)
    if task in FEWSHOT_TASKS:
        return fewshot_problems(task, FEWSHOT_TASKS[task](), 1, seed, split, FEWSHOT_SHOTS)[0].prompt()
    return arithmetic_problems(1, seed=seed, split=split, level=ARITHMETIC_TASKS[task])[0].prompt()
