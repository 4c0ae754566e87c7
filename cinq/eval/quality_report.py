"""The quantization quality report: rows (``ModelQuality``), the markdown table with deltas and their standard
errors against the first row, the findings (cinq.eval.findings), JSON, and the plot of accuracy loss against
perplexity loss. How rows are measured: cinq.eval.quant_quality; how variants are made and cached:
cinq.eval.quant_study."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from cinq.eval.findings import FLAT_PPL_PCT, HIDDEN, Z, classify, delta, findings
from cinq.markdown_table import markdown_table

log = logging.getLogger(__name__)
DEQUANTIZED_NOTE = "bf16 kernel: dequantized at load"


@dataclass(slots=True)
class ModelQuality:
    """One row of the report (JSON-ready: ``to_dict`` / ``from_dict``)."""

    label: str
    path: str
    method: str  # "float" for unquantized models
    bits: int | None
    weight_bytes: int  # all tensors of the checkpoint (packed integers as stored)
    perplexity: float | None
    accuracy: float | None
    n_problems: int
    gen_tokens_per_s: float | None = None  # batched generation throughput of the arithmetic pass
    kl_vs_base: float | None = None  # mean KL(base || model) per token on the perplexity text, nats
    top1_vs_base: float | None = None  # fraction of those tokens where both models' argmax agree
    step_accuracy: float | None = None  # worked steps reproduced exactly after the correct earlier steps
    n_steps: int = 0
    accuracy_se: float | None = None  # binomial
    step_accuracy_se: float | None = None  # cluster-robust by problem
    group_size: int | None = None  # None: not quantized; -1: per output channel
    linear_bytes: int = 0  # the decoder linears' tensors alone
    decode_tokens_per_s: float | None = None  # batch-1 greedy decode, median of runs
    kernels: list[str] = field(default_factory=list)  # kernel kinds of the served decoder linears
    spec: str = ""  # the variant it was made from (cinq.quant.variants), "" for given folders
    eval_seconds: float = 0.0
    quantize_seconds: float = 0.0
    correct: list[int] = field(default_factory=list)  # per problem, for paired deltas
    step_hits: list[int] = field(default_factory=list)
    step_counts: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelQuality:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def speed_note(self) -> str:
        """Batch-1 tokens/s as the table shows it, with how the weights were served."""
        if self.decode_tokens_per_s is None:
            return "-"
        from cinq.layers.quantization.kernels import DEQUANTIZED_AT_LOAD
        note = f" ({DEQUANTIZED_NOTE})" if DEQUANTIZED_AT_LOAD in self.kernels else ""
        return f"{self.decode_tokens_per_s:.1f}{note}"


@dataclass(slots=True)
class QualityReport:
    """Rows plus the rendering: markdown table with deltas vs the first row and findings, JSON, plot.
    ``skipped``: (variant, reason) of requested variants that were not run."""

    rows: list[ModelQuality]
    ppl_source: str = ""
    task: str = "arithmetic"
    skipped: list[tuple[str, str]] = field(default_factory=list)
    flat_ppl_pct: float = FLAT_PPL_PCT
    z: float = Z
    title: str = ""
    notes: list[str] = field(default_factory=list)

    def to_markdown(self) -> str:
        base = self.rows[0] if self.rows else None
        head = ["model", "method", "bits", "group", "weight MiB", "size vs base", "linear MiB", "perplexity", "Δppl",
                "KL vs base", "top-1 = base", f"{self.task} acc ± SE", "Δacc ± SE", "step acc ± SE", "Δstep ± SE",
                "batch-1 tok/s", "gen tok/s", "finding"]
        rows = []
        for r in self.rows:
            d = delta(r, base) if base is not None and r is not base else None
            kind = classify(d, self.flat_ppl_pct, self.z) if d is not None else "baseline"
            size = f"{r.weight_bytes / base.weight_bytes:.2f}x" if base and base.weight_bytes else "-"
            group = "-" if r.group_size is None else ("channel" if r.group_size <= 0 else str(r.group_size))
            rows.append([
                r.label, r.method, str(r.bits or "-"), group, f"{r.weight_bytes / 2**20:.2f}", size,
                f"{r.linear_bytes / 2**20:.2f}", _fmt(r.perplexity, ".3f"),
                "-" if d is None or d.ppl_pct is None else f"{d.ppl_pct:+.1f}%", _fmt(r.kl_vs_base, ".5f"),
                _pct(r.top1_vs_base), _pm(r.accuracy, r.accuracy_se),
                _dpm(None if d is None else d.acc_pt, None if d is None else d.acc_se_pt),
                _pm(r.step_accuracy, r.step_accuracy_se),
                _dpm(None if d is None else d.step_pt, None if d is None else d.step_se_pt),
                r.speed_note(), _fmt(r.gen_tokens_per_s, ".1f"), "**⚑ " + kind + "**" if kind == HIDDEN else kind])
        lines = ([f"# {self.title}", ""] if self.title else []) + [markdown_table(head, rows, "l" * len(head))]
        out = "\n".join(lines) + "\n" + self._legend()
        found = findings(self.rows, self.flat_ppl_pct, self.z)
        if found:
            out += "\n## Findings\n\n" + "\n".join(found) + "\n"
        if self.skipped:
            out += "\n## Skipped variants\n\n" + "".join(f"- {v}: {why}\n" for v, why in self.skipped)
        if self.notes:
            out += "\n" + "\n".join(self.notes) + "\n"
        return out

    def _legend(self) -> str:
        if not self.rows:
            return ""
        r0 = self.rows[0]
        ppl = (f"perplexity on {self.ppl_source}; KL vs base / top-1: next-token distributions against the "
               f"first row's on the first tokens of that text" if self.ppl_source else "no perplexity text given")
        # One-line (few-shot) tasks have no worked steps: say so instead of "each of their 0 worked steps".
        steps = (f"step acc: each of their {r0.n_steps} worked steps generated after the correct earlier steps, exact "
                 f"match of the line, SE cluster-robust by problem" if r0.n_steps else
                 "step acc: none (one-line answers have no worked steps)")
        return (f"\n{ppl}; accuracy: exact match over {r0.n_problems} held-out {self.task} problems (greedy), SE "
                f"binomial; {steps}; Δ SEs are paired (same problems). "
                f"Finding: '{HIDDEN}' = |Δppl| <= {self.flat_ppl_pct:g}% while accuracy or step accuracy falls by "
                f"more than {self.z:g} SE of the difference. batch-1 tok/s: one greedy request through the engine, "
                f"prefill excluded, median of runs; gen tok/s: batched generation throughput of the accuracy pass. "
                f"Bytes: the tensors as stored (2/3-bit: packed).\n")

    def to_json(self) -> dict[str, Any]:
        return {"ppl_source": self.ppl_source, "task": self.task, "flat_ppl_pct": self.flat_ppl_pct, "z": self.z,
                "skipped": [{"variant": v, "reason": why} for v, why in self.skipped],
                "rows": [r.to_dict() for r in self.rows]}

    def save(self, folder: str | Path, name: str = "quality") -> list[Path]:
        """Write <name>.md, <name>.json and (with matplotlib) <name>.png into ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        md, js = folder / f"{name}.md", folder / f"{name}.json"
        md.write_text(self.to_markdown())
        js.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        out = [md, js]
        png = self.plot(folder / f"{name}.png")
        if png is not None:
            out.append(png)
        return out

    def plot(self, path: str | Path) -> Path | None:
        """Accuracy loss (and step-accuracy loss) against perplexity loss, one point per variant with ±Z SE
        bars; the flat-perplexity band shaded, hidden losses labelled. None without matplotlib or rows."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            log.warning("matplotlib is not installed: no plot")
            return None
        if len(self.rows) < 2:
            return None
        base = self.rows[0]
        points = [(r, delta(r, base)) for r in self.rows[1:]]
        methods = sorted({r.method.split(" ")[0] for r, _ in points})
        colors = {m: f"C{i}" for i, m in enumerate(methods)}
        markers = {2: "v", 3: "s", 4: "o", 8: "D"}
        fig, axes = plt.subplots(1, 2, figsize=(12, 5))
        for ax, (what, get) in zip(axes, (("accuracy", lambda d: (d.acc_pt, d.acc_se_pt)),
                                          ("step accuracy", lambda d: (d.step_pt, d.step_se_pt)))):
            ax.axvspan(-self.flat_ppl_pct, self.flat_ppl_pct, color="#ddd", zorder=0,
                       label=f"|Δppl| <= {self.flat_ppl_pct:g}%")
            ax.axhline(0, color="black", linewidth=0.6)
            for r, d in points:
                y, se = get(d)
                if d.ppl_pct is None or y is None:
                    continue
                hidden = classify(d, self.flat_ppl_pct, self.z) == HIDDEN
                ax.errorbar(d.ppl_pct, y, yerr=None if se is None else self.z * se, fmt=markers.get(r.bits, "o"),
                            color=colors[r.method.split(" ")[0]], ecolor="#999", capsize=2, markersize=6,
                            markeredgecolor="red" if hidden else "none", markeredgewidth=1.5)
                if hidden:
                    ax.annotate(r.label, (d.ppl_pct, y), fontsize=7, xytext=(4, -8), textcoords="offset points")
            ax.set_xscale("symlog", linthresh=max(self.flat_ppl_pct, 1.0))
            ax.set_xlabel(f"Δ perplexity % vs {base.label}")
            ax.set_ylabel(f"Δ {what} (points), bars ±{self.z:g} SE")
            ax.set_title(f"{self.task}: {what} loss vs perplexity loss", fontsize=10)
        handles = [plt.Line2D([], [], color=colors[m], marker="o", linestyle="", label=m) for m in methods]
        handles += [plt.Line2D([], [], color="#555", marker=mk, linestyle="", label=f"{b}-bit")
                    for b, mk in markers.items() if any(r.bits == b for r, _ in points)]
        handles.append(plt.Line2D([], [], color="#555", marker="o", markeredgecolor="red", linestyle="",
                                  label=HIDDEN))
        axes[1].legend(handles=handles, fontsize=8, loc="lower left")
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _pm(v: float | None, se: float | None) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" + ("" if se is None else f" ± {100 * se:.1f}")


def _dpm(d: float | None, se: float | None) -> str:
    if d is None:
        return "-"
    return f"{d:+.1f} pt" + ("" if se is None else f" ± {se:.1f}")
