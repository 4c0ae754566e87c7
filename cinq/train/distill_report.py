"""The distillation report: the KD-vs-CE comparison of trained models (teacher and students) as a markdown
table, JSON and a plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cinq.markdown_table import markdown_table


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def distill_table(rows: dict[str, dict[str, Any]]) -> str:
    """One row per model: held-out perplexity per language, pooled perplexity, KL to the teacher, arithmetic
    accuracy (whole problems, and steps after a correct prefix; "—" where a run predates step scoring)."""
    langs: list[str] = []
    for r in rows.values():
        langs += [k for k in r["perplexity"] if k != "all" and k not in langs]
    head = ["model", "params", "tokens", "train s"] + [f"ppl {k}" for k in langs] + \
        ["ppl all", "KL→teacher", "arith acc", "step acc"]
    table = []
    for name, r in rows.items():
        cells = [name, f"{r['parameters'] / 1e6:.2f}M", _fmt(r.get("tokens_seen")), _fmt(r.get("train_seconds"), 0)]
        cells += [_fmt(r["perplexity"].get(k)) for k in langs]
        cells += [_fmt(r["perplexity"].get("all")), _fmt(r.get("kl_to_teacher"), 3),
                  _fmt(r["arithmetic"]["accuracy"], 3), _fmt(r["arithmetic"].get("step_accuracy"), 3)]
        table.append(cells)
    return markdown_table(head, table, "l" * len(head)) + "\n"


def write_report(rows: dict[str, dict[str, Any]], out_prefix: str | Path, title: str, notes: str = "") -> list[Path]:
    """Write ``<prefix>.md``, ``<prefix>.json`` and (with matplotlib) ``<prefix>.png``; returns the paths."""
    prefix = Path(out_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    md = f"# {title}\n\n{distill_table(rows)}\n{notes}"
    paths = [prefix.with_suffix(".md"), prefix.with_suffix(".json")]
    paths[0].write_text(md)
    slim = {k: {kk: vv for kk, vv in v.items() if kk != "model_dir"} for k, v in rows.items()}
    paths[1].write_text(json.dumps(slim, indent=2, ensure_ascii=False) + "\n")
    try:
        paths.append(plot_comparison(rows, prefix.with_suffix(".png")))
    except ImportError:
        pass
    return paths


def plot_comparison(rows: dict[str, dict[str, Any]], out: Path) -> Path:
    """Grouped bars: perplexity per language (log scale) for each model, and arithmetic accuracy."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    langs = [k for k in next(iter(rows.values()))["perplexity"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [4, 1]})
    width = 0.8 / len(rows)
    for i, (name, r) in enumerate(rows.items()):
        xs = [j + i * width for j in range(len(langs))]
        ax1.bar(xs, [r["perplexity"].get(k, 0) for k in langs], width, label=name, color=f"C{i}")
        ax2.bar(i, r["arithmetic"]["accuracy"], 0.6, color=f"C{i}")
    ax1.set_xticks([j + width * (len(rows) - 1) / 2 for j in range(len(langs))], langs)
    ax1.set_yscale("log")
    ax1.set_ylabel("held-out perplexity")
    ax1.legend(fontsize=8)
    ax2.set_xticks(range(len(rows)), list(rows), rotation=30, ha="right", fontsize=8)
    ax2.set_ylabel("arithmetic accuracy")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
