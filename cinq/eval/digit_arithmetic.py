"""The ``addsub-1digit`` task: single-digit addition and the subtractions that undo it, as few-shot lines.

Items: every ``a + b =`` with a, b in 0..9 (100) and every ``c - b =`` with b in 0..9 and a single-digit
result (c = a + b: 100), 200 in all, 150 of them in the test split (cinq.eval.fewshot). Measured on
SmolLM2-135M-Instruct (bf16): about 65% on the additions and 35% on the subtractions with 6 examples, so the
mix sits near the middle of the range where a quantization loss shows, not at a floor or a ceiling.
"""

from __future__ import annotations

from cinq.eval.fewshot import FewShotItem


def addsub_items() -> list[FewShotItem]:
    """The 200 items, additions first (the order does not matter: splits hash the questions)."""
    adds = [FewShotItem(f"{a} + {b} =", str(a + b)) for a in range(10) for b in range(10)]
    subs = [FewShotItem(f"{a + b} - {b} =", str(a)) for a in range(10) for b in range(10)]
    return adds + subs
