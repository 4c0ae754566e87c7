"""Findings of a quality report: each row's change against the baseline, with the SE of that change, sorted
into what perplexity shows and what it hides.

A row is *hidden loss* (flagged) when its perplexity stays flat (|Δppl| <= ``flat_ppl_pct`` percent) while its
whole-problem or step accuracy falls by more than ``z`` standard errors of the difference: the case the study
(arXiv 2505.11574) is about. Differences are paired (same problems for every row; cinq.eval.standard_error),
falling back to sqrt(SE_a^2 + SE_b^2) for rows without per-problem outcomes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cinq.eval.standard_error import paired_cluster_diff_se, paired_diff_se

FLAT_PPL_PCT = 3.0  # |Δ perplexity| within this many percent counts as "flat"
Z = 2.0  # a fall of more than Z standard errors of the difference is a loss

HIDDEN, VISIBLE, PPL_ONLY, NONE, UNKNOWN = "hidden loss", "visible loss", "perplexity only", "no change", "-"


@dataclass(slots=True)
class Delta:
    """A row's change against the baseline: Δppl in percent, Δaccuracy / Δstep accuracy in points with SEs."""

    ppl_pct: float | None
    acc_pt: float | None
    acc_se_pt: float | None
    step_pt: float | None
    step_se_pt: float | None

    def acc_z(self) -> float | None:
        return _z(self.acc_pt, self.acc_se_pt)

    def step_z(self) -> float | None:
        return _z(self.step_pt, self.step_se_pt)


def _z(d: float | None, se: float | None) -> float | None:
    if d is None or se is None:
        return None
    return d / se if se > 0 else (0.0 if d == 0 else math.copysign(math.inf, d))


def delta(row: Any, base: Any) -> Delta:
    """The change of ``row`` against ``base`` (ModelQuality rows)."""
    ppl = (100.0 * (row.perplexity / base.perplexity - 1.0)
           if row.perplexity is not None and base.perplexity else None)
    acc = acc_se = step = step_se = None
    if row.accuracy is not None and base.accuracy is not None:
        acc = 100.0 * (row.accuracy - base.accuracy)
        if row.correct and len(row.correct) == len(base.correct):
            acc_se = 100.0 * paired_diff_se(row.correct, base.correct)
        else:
            acc_se = 100.0 * math.hypot(row.accuracy_se or 0.0, base.accuracy_se or 0.0)
    if row.step_accuracy is not None and base.step_accuracy is not None:
        step = 100.0 * (row.step_accuracy - base.step_accuracy)
        if row.step_hits and len(row.step_hits) == len(base.step_hits) and row.step_counts == base.step_counts:
            step_se = 100.0 * paired_cluster_diff_se(row.step_hits, base.step_hits, row.step_counts)
        else:
            step_se = 100.0 * math.hypot(row.step_accuracy_se or 0.0, base.step_accuracy_se or 0.0)
    return Delta(ppl, acc, acc_se, step, step_se)


def _falls(d: float | None, se: float | None, z: float) -> bool:
    return d is not None and se is not None and d < 0 and d < -z * se


def classify(d: Delta, flat_ppl_pct: float = FLAT_PPL_PCT, z: float = Z) -> str:
    """HIDDEN / VISIBLE / PPL_ONLY / NONE (UNKNOWN without perplexity or accuracy)."""
    if d.ppl_pct is None or (d.acc_pt is None and d.step_pt is None):
        return UNKNOWN
    falls = _falls(d.acc_pt, d.acc_se_pt, z) or _falls(d.step_pt, d.step_se_pt, z)
    flat = abs(d.ppl_pct) <= flat_ppl_pct
    if falls:
        return HIDDEN if flat else VISIBLE
    return NONE if flat else PPL_ONLY


def _pt(d: float | None, se: float | None) -> str:
    if d is None:
        return "-"
    return f"{d:+.1f} pt" + (f" (SE {se:.1f})" if se is not None else "")


def sentence(label: str, d: Delta, kind: str, flat_ppl_pct: float = FLAT_PPL_PCT, z: float = Z) -> str:
    """One finding about a row, as a markdown bullet."""
    ppl = "-" if d.ppl_pct is None else f"{d.ppl_pct:+.1f}%"
    acc, step = _pt(d.acc_pt, d.acc_se_pt), _pt(d.step_pt, d.step_se_pt)
    if kind == HIDDEN:
        what = [f"accuracy {acc}" if _falls(d.acc_pt, d.acc_se_pt, z) else "",
                f"step accuracy {step}" if _falls(d.step_pt, d.step_se_pt, z) else ""]
        return (f"- **{label}**: perplexity stays flat ({ppl}, within ±{flat_ppl_pct:g}%) while "
                f"{' and '.join(w for w in what if w)} fell by more than {z:g} SE: perplexity hides this loss.")
    if kind == VISIBLE:
        return (f"- {label}: perplexity {ppl} and accuracy {acc}, step accuracy {step}: the loss shows in "
                f"perplexity too.")
    if kind == PPL_ONLY:
        return (f"- {label}: perplexity {ppl}, but no accuracy fall beyond {z:g} SE (accuracy {acc}, step "
                f"accuracy {step}).")
    if kind == NONE:
        return f"- {label}: no significant change (perplexity {ppl}, accuracy {acc}, step accuracy {step})."
    return f"- {label}: not enough measurements to compare (perplexity {ppl}, accuracy {acc})."


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman rank correlation (average ranks for ties); None for fewer than 3 pairs or a constant series."""
    if len(x) != len(y) or len(x) < 3:
        return None

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2.0
            i = j + 1
        return r
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx, sy = math.sqrt(sum((a - mx) ** 2 for a in rx)), math.sqrt(sum((b - my) ** 2 for b in ry))
    return sxy / (sx * sy) if sx > 0 and sy > 0 else None


def findings(rows: Sequence[Any], flat_ppl_pct: float = FLAT_PPL_PCT, z: float = Z) -> list[str]:
    """Markdown lines: a summary, then one bullet per row after the baseline (hidden losses first)."""
    if len(rows) < 2:
        return []
    base = rows[0]
    deltas = [(r, delta(r, base)) for r in rows[1:]]
    kinds = [(r, d, classify(d, flat_ppl_pct, z)) for r, d in deltas]
    hidden = [r.label for r, _, k in kinds if k == HIDDEN]
    lines = []
    if hidden:
        lines.append(f"Perplexity stays flat (|Δppl| <= {flat_ppl_pct:g}%) while accuracy falls by more than {z:g} SE "
                     f"in {len(hidden)} of {len(kinds)} variants: {', '.join(hidden)}.")
    else:
        lines.append(f"No variant keeps perplexity flat (|Δppl| <= {flat_ppl_pct:g}%) while losing more than {z:g} SE "
                     f"of accuracy ({len(kinds)} variants against {base.label}).")
    tests = sum((d.acc_pt is not None) + (d.step_pt is not None) for _, d, _ in kinds)
    if tests:
        p = 0.5 * math.erfc(z / math.sqrt(2))  # one-sided: a fall beyond z SE by chance alone
        lines.append(f"Each of the {tests} comparisons (accuracy and step accuracy per variant) falls beyond {z:g} SE "
                     f"by chance with probability {p:.1%}: about {tests * p:.1f} flags are expected from noise alone, "
                     f"so a lone flag among clean neighbours (same bits, other group sizes) is weak evidence.")
    pairs = [(d.ppl_pct, d.acc_pt) for _, d, _ in kinds if d.ppl_pct is not None and d.acc_pt is not None]
    rho = spearman([p for p, _ in pairs], [a for _, a in pairs])
    if rho is not None:
        lines.append(f"Rank correlation of Δppl and Δaccuracy over the variants: Spearman ρ = {rho:+.2f} "
                     f"(-1: perplexity ranks the accuracy losses exactly).")
    safe = [r for r, d, k in kinds if k in (NONE, PPL_ONLY) and r.weight_bytes]
    if safe:
        small = min(safe, key=lambda r: r.weight_bytes)
        lines.append(f"Smallest checkpoint without a significant accuracy fall: {small.label} "
                     f"({small.weight_bytes / 2**20:.2f} MiB, {small.weight_bytes / max(base.weight_bytes, 1):.2f}x "
                     f"{base.label}).")
    order = {HIDDEN: 0, VISIBLE: 1, PPL_ONLY: 2, NONE: 3, UNKNOWN: 4}
    lines.append("")
    lines += [sentence(r.label, d, k, flat_ppl_pct, z) for r, d, k in sorted(kinds, key=lambda t: order[t[2]])]
    return lines
