"""The arithmetic reasoning benchmark, one implementation for every report (model cards, distillation and
quantization reports): greedy answers to held-out word problems (cinq.tasks), scored whole (the
``Answer:`` line) and step by step (each worked step generated after the correct earlier ones), with standard
errors (cinq.eval.standard_error) and the per-problem outcomes that paired comparisons between models need.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cinq.errors import InvalidParameterError
from cinq.eval.generation import EngineGenerator, GenerateFn, NaiveGenerator
from cinq.eval.standard_error import binomial_se, cluster_ratio_se
from cinq.tasks import TASKS, arithmetic_problems, extract_answer, step_items

WHOLE_STOP = ("\nQuestion",)  # the next document of the task's format starts: the answer is complete
STEP_STOP = ("\n",)  # a step item is scored on the completion's first line only
STEP_MAX_TOKENS = 16


@dataclass(slots=True)
class ArithmeticResult:
    """Accuracy on ``n_problems`` problems (whole and per step) with SEs, timing, per-problem outcomes, samples."""

    task: str
    split: str
    seed: int
    n_problems: int
    accuracy: float
    accuracy_se: float  # binomial
    n_steps: int
    step_accuracy: float
    step_accuracy_se: float  # cluster-robust by problem
    step_accuracy_se_simple: float  # binomial over steps (ignores the clustering)
    seconds: float
    tokens_per_s: float  # batched generation throughput of the whole-problem pass
    correct: list[int] = field(default_factory=list)  # per problem: 1 when the answer is right
    step_hits: list[int] = field(default_factory=list)  # per problem: steps reproduced exactly
    step_counts: list[int] = field(default_factory=list)  # per problem: its number of steps
    samples: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score(problems: list[Any], completions: list[str], step_completions: list[str]) -> tuple[list[int], list[int]]:
    """(1/0 per problem for its answer, exact steps per problem) of the completions."""
    items = step_items(problems)
    if len(completions) != len(problems) or len(step_completions) != len(items):
        raise InvalidParameterError(f"got {len(completions)} completions for {len(problems)} problems and "
                                    f"{len(step_completions)} for {len(items)} steps (must be equal)", "completions")
    correct = [int(extract_answer(c) == p.answer) for p, c in zip(problems, completions)]
    hits, k = [], 0
    for p in problems:
        lines = step_completions[k:k + len(p.steps)]
        its = items[k:k + len(p.steps)]
        hits.append(sum(c.split("\n", 1)[0].strip() == it.expected for it, c in zip(its, lines)))
        k += len(p.steps)
    return correct, hits


def make_generator(model_dir: str | Path, generator: str | GenerateFn = "engine", dtype: str = "bfloat16",
                   model: Any = None) -> GenerateFn:
    """``generator``: "engine" (the serving engine on ``model_dir``), "naive" (no engine; ``model``: an
    already loaded module, else the folder is loaded in ``dtype``), or a GenerateFn used as it is."""
    if callable(generator):
        return generator
    if generator == "engine":
        return EngineGenerator(model_dir, dtype=dtype)
    if generator == "naive":
        return NaiveGenerator.from_folder(model_dir, dtype=dtype, model=model)
    raise InvalidParameterError(f"generator must be 'engine', 'naive' or a callable, got {generator!r}", "generator")


def evaluate_arithmetic(model_dir: str | Path, task: str = "arithmetic", n: int = 300, seed: int = 0,
                        split: str = "test", generator: str | GenerateFn = "engine", dtype: str = "bfloat16",
                        model: Any = None, max_new_tokens: int = 96, n_samples: int = 3) -> ArithmeticResult:
    """Greedy exact-match accuracy of the model folder ``model_dir`` on ``n`` problems of ``task``
    ("arithmetic" / "arithmetic-easy"), whole and per step; see ``make_generator`` for ``generator``."""
    if task not in TASKS:
        raise InvalidParameterError(f"task must be one of {sorted(TASKS)}, got {task!r}", "task")
    if not isinstance(n, int) or n < 1:
        raise InvalidParameterError(f"n must be a positive integer, got {n!r}", "n")
    problems = arithmetic_problems(n, seed=seed, split=split, level=TASKS[task])
    gen = make_generator(model_dir, generator, dtype, model)
    start = time.perf_counter()
    completions, tps = gen([p.prompt() for p in problems], max_new_tokens, WHOLE_STOP)
    step_completions, _ = gen([it.prompt for it in step_items(problems)], STEP_MAX_TOKENS, STEP_STOP)
    seconds = time.perf_counter() - start
    correct, hits = score(problems, completions, step_completions)
    counts = [len(p.steps) for p in problems]
    acc, step_acc = sum(correct) / n, sum(hits) / sum(counts)
    samples = [{"prompt": p.prompt(), "completion": c, "answer": p.answer}
               for p, c in zip(problems[:n_samples], completions[:n_samples])]
    return ArithmeticResult(task, split, seed, n, acc, binomial_se(acc, n), sum(counts), step_acc,
                            cluster_ratio_se(hits, counts), binomial_se(step_acc, sum(counts)), seconds, tps,
                            correct, hits, counts, samples)
