"""Measure training throughput of candidate model shapes on this machine (how cinq-tiny was sized):
tokens/s of full training steps (forward, backward, AdamW) with bf16 autocast and, as the baseline measured in
the same run, in float32; plus the minutes a token budget would take at that speed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cinq.train.presets import model_config, new_model


def measure(spec: str | dict[str, Any], vocab_size: int, batch_size: int, seq_len: int, steps: int = 5,
            bf16: bool = True) -> dict[str, float]:
    """Median tokens/s over ``steps`` training steps (after one warm-up step) on random tokens."""
    model = new_model(model_config(spec, vocab_size, 0, 1), seed=0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=torch.Generator().manual_seed(0))
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model.compute_logits(model(x[:, :-1]))
        F.cross_entropy(logits.reshape(-1, vocab_size), x[:, 1:].reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - t0)
    dt = sorted(times)[len(times) // 2]
    return {"parameters": float(sum(p.numel() for p in model.parameters())), "tokens_per_s": batch_size * seq_len / dt}


def sizing_table(specs: list[str], vocab_size: int, batch_size: int, seq_len: int, budget_tokens: float,
                 out_prefix: str | Path | None = None) -> list[dict[str, Any]]:
    """One row per shape: parameters, bf16 and float32 tokens/s, speed-up, minutes for ``budget_tokens``."""
    rows = []
    for spec in specs:
        fast = measure(spec, vocab_size, batch_size, seq_len, bf16=True)
        base = measure(spec, vocab_size, batch_size, seq_len, bf16=False)
        rows.append({"config": spec, "parameters": int(fast["parameters"]),
                     "bf16_tokens_per_s": fast["tokens_per_s"], "fp32_tokens_per_s": base["tokens_per_s"],
                     "bf16_speedup": fast["tokens_per_s"] / base["tokens_per_s"],
                     "minutes_for_budget": budget_tokens / fast["tokens_per_s"] / 60})
    if out_prefix is not None:
        prefix = Path(out_prefix)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"# Training throughput by model shape (batch {batch_size} x {seq_len}, "
                 f"{torch.get_num_threads()} thread(s))", "",
                 "| config | params | bf16 tok/s | fp32 tok/s | bf16 speed-up | "
                 f"min for {budget_tokens / 1e6:.0f}M tok |",
                 "|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['config']} | {r['parameters'] / 1e6:.2f}M | {r['bf16_tokens_per_s']:.0f} | "
                         f"{r['fp32_tokens_per_s']:.0f} | {r['bf16_speedup']:.2f}x | {r['minutes_for_budget']:.0f} |")
        lines += ["", "Measured by `cinq train --measure` (full training steps on random tokens; the machine may be "
                      "shared, so numbers are only comparable within this table).", ""]
        prefix.with_suffix(".md").write_text("\n".join(lines))
        prefix.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    return rows
