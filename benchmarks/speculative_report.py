"""Markdown tables and a plot from benchmarks/speculative.py's measurements (its JSON)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _cell(r: dict[str, Any]) -> str:
    return f"**{r['speedup']:.2f}x** ({r['tau'] or 0:.2f})"


def crossover(rows: list[dict[str, Any]]) -> int | None:
    """The smallest measured batch size at which a (non-adaptive) method is slower than plain decoding."""
    slower = sorted(r["batch"] for r in rows if r["speedup"] < 1.0)
    return slower[0] if slower else None


def render(data: dict[str, Any], md: Path, png: Path | None = None) -> None:
    meta, sweep = data["machine"], data["batch_sweep"]
    batches = sorted({r["batch"] for r in sweep})
    methods = list(dict.fromkeys(r["method"] for r in sweep))
    lines = ["# Speculative decoding vs plain decoding (same target, same prompts, one run)", "",
             f"cinq-tiny target, greedy, {meta['max_tokens']} new tokens per request, k = {meta['k']} (adaptive: up "
             f"to k); CPU threads {meta['threads']}, load average at end {meta['loadavg_at_end']}. Prompts: the "
             "corpus test split, every language mixed. Cells: speedup over plain decoding at the same batch size "
             "measured in the same run, and tau (mean tokens per verify step) in brackets.", ""]
    for target in dict.fromkeys(r["target"] for r in sweep):
        lines += [f"## Batch sweep, {target} target", "",
                  "| method | adaptive | " + " | ".join(f"batch {b}" for b in batches) + " | crossover | draft share b1 |",
                  "|---|---|" + "---:|" * len(batches) + "---:|---:|"]
        for m in methods:
            for adaptive in (False, True):
                rows = [r for r in sweep if r["target"] == target and r["method"] == m and r["adaptive"] == adaptive]
                if not rows:
                    continue
                by_b = {r["batch"]: r for r in rows}
                cross = crossover(rows)
                share = by_b[batches[0]]["draft_share"] if batches[0] in by_b else 0.0
                lines.append(f"| {m} | {'on' if adaptive else 'off'} | "
                             + " | ".join(_cell(by_b[b]) if b in by_b else "" for b in batches)
                             + f" | {'never' if cross is None and not adaptive else (cross or '-')} | "
                               f"{100 * share:.0f}% |")
        rows_t = [r for r in sweep if r["target"] == target]
        plain = {r["batch"]: r["plain_tok_s"] for r in rows_t}
        same = sum(r["greedy_identical"] for r in rows_t)
        drift = {r["batch"]: r.get("baseline_drift") for r in rows_t}
        lines += ["", "Plain tokens/s (mean of a run before and one after the methods; after/before in brackets): "
                  + ", ".join(f"batch {b}: {plain[b]:.0f} ({drift[b] or 1:.2f})" for b in sorted(plain))
                  + f". Greedy tokens identical to plain decoding: {same} of {len(rows_t)} cells.", ""]
    pos = [r for r in sweep if r["batch"] == batches[0] and not r["adaptive"] and r["target"] == sweep[0]["target"]]
    lines += ["## Acceptance per draft position (batch 1, first target)", "",
              "| method | " + " | ".join(f"pos {i + 1}" for i in range(meta["k"])) + " |",
              "|---|" + "---:|" * meta["k"]]
    for r in pos:
        cells = [f"{a:.2f}" for a in r["accept_per_pos"]] + [""] * (meta["k"] - len(r["accept_per_pos"]))
        lines.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    langs = list(dict.fromkeys(r["lang"] for r in data["languages"]))
    lang_methods = list(dict.fromkeys(r["method"] for r in data["languages"]))
    lines += ["", "## Per language (batch 1, bf16)", "",
              "| language | " + " | ".join(lang_methods) + " |", "|---|" + "---:|" * len(lang_methods)]
    for lang in langs:
        cells = [next((_cell(r) for r in data["languages"] if r["lang"] == lang and r["method"] == m), "")
                 for m in lang_methods]
        lines.append(f"| {lang} | " + " | ".join(cells) + " |")
    ratios = []
    for m in lang_methods:
        taus = [r["tau"] for r in data["languages"] if r["method"] == m and r["tau"]]
        ratios.append(f"{min(taus) / max(taus):.2f}" if taus else "")
    lines.append("| worst / best tau | " + " | ".join(ratios) + " |")
    lines += ["", "## Copy workload (batch 1, bf16: the answer repeats the prompt)", "",
              "| method | speedup (tau) |", "|---|---:|"]
    lines += [f"| {r['method']} | {_cell(r)} |" for r in data["copy"]]
    md.write_text("\n".join(lines) + "\n")
    if png is not None:
        _plot(sweep, batches, methods, png)


def _plot(sweep: list[dict[str, Any]], batches: list[int], methods: list[str], png: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    target = sweep[0]["target"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for m in methods:
        for adaptive, style in ((False, "-"), (True, "--")):
            pts = sorted((r["batch"], r["speedup"]) for r in sweep
                         if r["target"] == target and r["method"] == m and r["adaptive"] == adaptive)
            if pts:
                ax.plot([b for b, _ in pts], [s for _, s in pts], style, marker="o",
                        label=f"{m}{' adaptive' if adaptive else ''}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(f"Speculative decoding on cinq-tiny ({target}), CPU")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
