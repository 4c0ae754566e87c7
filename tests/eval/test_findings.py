"""Findings on a synthetic report: which rows are flagged (perplexity flat, accuracy down by more than 2 SE of
the paired difference), and the sentences, table marks and plot that say so."""

from __future__ import annotations

import json

import pytest

from cinq.eval.findings import HIDDEN, NONE, PPL_ONLY, VISIBLE, classify, delta, findings, spearman
from cinq.eval.quality_report import ModelQuality, QualityReport

N = 200


def row(label: str, ppl: float, correct: list[int], hits: list[int] | None = None, bits: int | None = 4,
        nbytes: int = 100) -> ModelQuality:
    hits = hits if hits is not None else [2 * c for c in correct]
    acc = sum(correct) / N
    return ModelQuality(label, "p", "float" if bits is None else "rtn (gptq)", bits, nbytes, ppl, acc, N,
                        step_accuracy=sum(hits) / (2 * N), n_steps=2 * N, accuracy_se=(acc * (1 - acc) / N) ** 0.5,
                        step_accuracy_se=0.01, correct=correct, step_hits=hits, step_counts=[2] * N)


def lose(base: list[int], k: int) -> list[int]:
    """``base`` with its first ``k`` right answers turned wrong."""
    out, left = list(base), k
    for i, c in enumerate(out):
        if c and left:
            out[i], left = 0, left - 1
    return out


BASE = [1 if i % 2 else 0 for i in range(N)]  # 50%


def report() -> QualityReport:
    rows = [row("bf16", 10.0, BASE, bits=None, nbytes=400),
            row("hidden", 10.1, lose(BASE, 16)),  # +1% ppl, -8 pt (paired SE ~1.9 pt)
            row("visible", 14.0, lose(BASE, 30), nbytes=50),  # +40% ppl, -15 pt
            row("ppl-only", 11.0, BASE, nbytes=80),  # +10% ppl, accuracy unchanged
            row("noise", 10.0, lose(BASE, 2), nbytes=90)]  # -1 pt: within 2 SE of the difference
    return QualityReport(rows, "text", "arithmetic-easy")


def test_rows_are_classified_by_the_paired_difference():
    r = report()
    base = r.rows[0]
    kinds = {x.label: classify(delta(x, base)) for x in r.rows[1:]}
    assert kinds == {"hidden": HIDDEN, "visible": VISIBLE, "ppl-only": PPL_ONLY, "noise": NONE}
    d = delta(r.rows[1], base)
    assert abs(d.acc_pt - -8.0) < 1e-9 and abs(d.ppl_pct - 1.0) < 1e-9
    assert abs(d.acc_se_pt - 100 * ((16 / N) * (1 - 16 / N) / (N - 1)) ** 0.5) < 1e-9  # sd of the diffs / sqrt(n)
    assert d.acc_se_pt < 0.5 * (2 ** 0.5 * 100 * base.accuracy_se)  # far tighter than the unpaired SE
    # A threshold that makes 1% "not flat" turns the hidden loss into a visible one.
    assert classify(d, flat_ppl_pct=0.5) == VISIBLE


def test_step_accuracy_alone_can_flag_a_row():
    base = row("bf16", 10.0, BASE, bits=None)
    steps = lose([2 * c for c in BASE], 30)  # 30 problems lose one step each (hits 2 -> 0 counts as 2 steps)
    only_steps = row("steps", 10.0, BASE, hits=[h if h != 0 or b == 0 else 1 for h, b in zip(steps, BASE)])
    d = delta(only_steps, base)
    assert d.acc_pt == 0.0 and d.step_pt < 0 and classify(d) == HIDDEN


def test_markdown_flags_and_sentences(tmp_path):
    r = report()
    md = r.to_markdown()
    hidden_line = next(line for line in md.splitlines() if line.startswith("| hidden |"))
    assert "⚑ hidden loss" in hidden_line and "-8.0 pt ± 1.9" in hidden_line
    assert sum("⚑" in line for line in md.splitlines() if line.startswith("|")) == 1
    assert "in 1 of 4 variants: hidden." in md
    assert "- **hidden**: perplexity stays flat (+1.0%, within ±3%) while accuracy -8.0 pt (SE 1.9)" in md
    assert "perplexity hides this loss" in md and md.count("perplexity hides this loss") == 1
    assert "- visible: perplexity +40.0%" in md and "- noise: no significant change" in md
    assert "Smallest checkpoint without a significant accuracy fall: ppl-only" in md
    files = r.save(tmp_path)
    assert {f.name for f in files} == {"quality.md", "quality.json", "quality.png"}
    data = json.loads((tmp_path / "quality.json").read_text())
    assert data["rows"][1]["label"] == "hidden" and len(data["rows"][1]["correct"]) == N
    assert ModelQuality.from_dict(data["rows"][1]) == r.rows[1]


def test_no_flag_when_nothing_is_hidden():
    r = report()
    r.rows = [r.rows[0], r.rows[2], r.rows[4]]
    lines = findings(r.rows)
    assert lines[0].startswith("No variant keeps perplexity flat")
    assert "⚑" not in r.to_markdown()


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None
