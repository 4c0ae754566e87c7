"""Loss-curve and comparison plots (matplotlib, optional dependency: imported here only)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_loss_curves(histories: dict[str, list[dict[str, float]]], out: str | Path,
                     evals: dict[str, list[dict[str, float]]] | None = None) -> Path:
    """Training loss per run against steps, with validation losses as points."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, hist) in enumerate(histories.items()):
        if not hist:
            continue
        color = f"C{i}"
        ax.plot([h["step"] for h in hist], [h["loss"] for h in hist], color=color, lw=1, label=f"{name} train")
        for e in (evals or {}).get(name, []):
            if "val_loss" in e:
                ax.plot(e["step"], e["val_loss"], "o", color=color, ms=4)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
