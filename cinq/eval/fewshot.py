"""Few-shot exact-match tasks: a model that cannot follow a word problem can still continue a pattern.

A task is a fixed list of items (a question and its one-line answer: ``4 + 3 =`` -> ``7``). Each item belongs
to one split, chosen by its rank in a hash order, so the splits have exact sizes (20% train, 5% validation, 75%
test) and no seed can move an item between them. A problem is a held-out item preceded by ``shots`` worked
examples drawn from the train split only (the same examples for every problem of a seed), one per line::

    3 + 5 = 8
    7 - 2 = 5
    ...
    4 + 3 =

and the model's greedy completion is right when its first line, stripped of spaces and a final period, is the
answer exactly (accents folded: see ``normalize``). Small models (SmolLM2-135M) score far above chance on such tasks while scoring near zero on
multi-step word problems, which is what a quantization study needs: a signal that can fall.
"""

from __future__ import annotations

import hashlib
import random
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from cinq.errors import InvalidParameterError

SPLITS = ("train", "validation", "test")
_FRACTIONS = {"train": 0.20, "validation": 0.05}  # the rest is test
STOP = ("\n",)  # one item per line: the next line is the model inventing another problem
MAX_NEW_TOKENS = 8  # answers are a number or a city name


@dataclass(frozen=True, slots=True)
class FewShotItem:
    """One question with its one-line answer; ``key`` identifies it for the split hash."""

    question: str
    answer: str

    @property
    def key(self) -> str:
        return self.question

    def line(self) -> str:
        """The item worked, as a few-shot example line."""
        return f"{self.question} {self.answer}\n"


@dataclass(frozen=True, slots=True)
class FewShotProblem:
    """A held-out item and the train examples shown before it."""

    item: FewShotItem
    shots: tuple[FewShotItem, ...]

    @property
    def answer(self) -> str:
        return self.item.answer

    def prompt(self) -> str:
        """The text given to the model; its completion's first line should be the answer."""
        return "".join(s.line() for s in self.shots) + self.item.question


def _rank_key(task: str, item: FewShotItem) -> bytes:
    return hashlib.sha256(f"{task}\0{item.key}".encode()).digest()


def split_items(task: str, items: Sequence[FewShotItem]) -> dict[str, list[FewShotItem]]:
    """The items of each split: the task's items ordered by a hash, cut at exact fractions (see the module
    docstring). Duplicate questions are an error: one question would then sit in two splits."""
    keys = [it.key for it in items]
    if len(set(keys)) != len(keys):
        raise InvalidParameterError(f"{task}: items must have distinct questions", "items")
    ordered = sorted(items, key=lambda it: _rank_key(task, it))
    n_train = round(len(ordered) * _FRACTIONS["train"])
    n_val = round(len(ordered) * _FRACTIONS["validation"])
    return {"train": ordered[:n_train], "validation": ordered[n_train:n_train + n_val],
            "test": ordered[n_train + n_val:]}


def fewshot_problems(task: str, items: Sequence[FewShotItem], n: int, seed: int = 0, split: str = "test",
                     shots: int = 8) -> list[FewShotProblem]:
    """``n`` problems of ``split`` (the first ``n`` of its items in a seeded order) behind the same ``shots``
    distinct train examples; the same for the same seed. More than the split holds is an error."""
    if split not in SPLITS:
        raise InvalidParameterError(f"split must be one of {SPLITS}, got {split!r}", "split")
    parts = split_items(task, items)
    pool, targets = parts["train"], list(parts[split])
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= len(targets):
        raise InvalidParameterError(f"n: {task} has {len(targets)} {split} items, got n={n!r}", "n")
    if not 0 <= shots <= len(pool):
        raise InvalidParameterError(f"shots: {task} has {len(pool)} train items, got shots={shots}", "shots")
    # One set of examples for every problem of a seed: the prompts then share their whole prefix, which the
    # engine's prefix cache computes once, instead of a full prefill per problem.
    examples = tuple(random.Random(f"cinq-fewshot-shots:{task}:{seed}").sample(pool, shots))
    if split == "train":  # a train item asked as a problem must not also be one of its examples
        targets = [t for t in targets if t not in examples]
    if n > len(targets):
        raise InvalidParameterError(f"n: {task} has {len(targets)} {split} items besides the examples, got n={n}",
                                    "n")
    rng = random.Random(f"cinq-fewshot:{task}:{seed}:{split}")
    rng.shuffle(targets)
    return [FewShotProblem(item, examples) for item in targets[:n]]


def normalize(completion: str) -> str:
    """The completion's first line without surrounding spaces, a final period or accents (``" Brasília."`` ->
    ``Brasilia``): the answers are written in ASCII, and an accent is a spelling, not a wrong fact. Case and
    every other character count."""
    line = completion.split("\n", 1)[0].strip().removesuffix(".").strip()
    return "".join(ch for ch in unicodedata.normalize("NFKD", line) if not unicodedata.combining(ch))


def score(problems: Sequence[FewShotProblem], completions: Sequence[str]) -> list[int]:
    """1 per problem whose normalized completion is exactly its answer, else 0."""
    if len(problems) != len(completions):
        raise InvalidParameterError(
            f"completions: got {len(completions)} for {len(problems)} problems (must be equal)", "completions")
    return [int(normalize(c) == p.answer) for p, c in zip(problems, completions)]
