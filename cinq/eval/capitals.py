"""The ``capitals`` task: "The capital of France is" -> "Paris", few-shot, for countries, US states, Canadian
provinces and Australian states (230 facts in cinq/assets/eval/capitals.tsv, 172 of them in the test split).

Recall of facts is what a quantized small model is said to lose first, and SmolLM2-135M-Instruct knows most
capitals (about 90% of well-known countries' when measured before), so the task can show a fall.
"""

from __future__ import annotations

from pathlib import Path

from cinq.eval.fewshot import FewShotItem

KINDS = ("country", "us-state", "canadian-province", "australian-state")


def capitals_file() -> Path:
    """The data file (shipped inside the package: nothing is downloaded)."""
    from cinq.assets import ASSETS_DIR
    return ASSETS_DIR / "eval" / "capitals.tsv"


def capital_rows(path: Path | None = None) -> list[tuple[str, str, str]]:
    """(region, kind, capital) for every line of the data file; ``#`` lines are comments."""
    rows = []
    for n, line in enumerate((path or capitals_file()).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 3 or parts[1] not in KINDS or not all(p.strip() == p and p for p in parts):
            raise ValueError(f"{path or capitals_file()} line {n}: expected region<TAB>kind<TAB>capital, got {line!r}")
        rows.append((parts[0], parts[1], parts[2]))
    return rows


def capital_items(path: Path | None = None) -> list[FewShotItem]:
    """One item per region: ``The capital of <region> is`` -> its capital."""
    return [FewShotItem(f"The capital of {region} is", capital) for region, _, capital in capital_rows(path)]
