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
from cinq.markdown_table import markdown_table


class _Bench:
    """One shape's model, optimizer and batch, kept across measurement rounds."""

    def __init__(self, spec: str | dict[str, Any], vocab_size: int, batch_size: int, seq_len: int) -> None:
        self.model = new_model(model_config(spec, vocab_size, 0, 1), seed=0).train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=torch.Generator().manual_seed(0))
        self.vocab_size = vocab_size
        self.times: dict[bool, list[float]] = {True: [], False: []}

    def step(self, bf16: bool) -> float:
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = self.model.compute_logits(self.model(self.x[:, :-1]))
        F.cross_entropy(logits.reshape(-1, self.vocab_size), self.x[:, 1:].reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0


def measure(specs: list[str], vocab_size: int, batch_size: int, seq_len: int, rounds: int = 4,
            steps: int = 2) -> list[dict[str, float]]:
    """Median tokens/s per shape and precision. Shapes and precisions take turns, ``steps`` training steps at
    a time for ``rounds`` rounds, so a load change on a shared machine hits every configuration alike."""
    benches = [_Bench(s, vocab_size, batch_size, seq_len) for s in specs]
    for b in benches:  # warm-up (allocator, autocast caches)
        b.step(True)
        b.step(False)
    for _ in range(rounds):
        for b in benches:
            for bf16 in (True, False):
                b.times[bf16] += [b.step(bf16) for _ in range(steps)]
    tokens = batch_size * seq_len
    out = []
    for b in benches:
        med = {k: sorted(v)[len(v) // 2] for k, v in b.times.items()}
        out.append({"parameters": float(sum(p.numel() for p in b.model.parameters())),
                    "bf16_tokens_per_s": tokens / med[True], "fp32_tokens_per_s": tokens / med[False]})
    return out


def sizing_table(specs: list[str], vocab_size: int, batch_size: int, seq_len: int, budget_tokens: float,
                 out_prefix: str | Path | None = None) -> list[dict[str, Any]]:
    """One row per shape: parameters, bf16 and float32 tokens/s, speed-up, minutes for ``budget_tokens``."""
    rows = []
    for spec, m in zip(specs, measure(specs, vocab_size, batch_size, seq_len)):
        rows.append({"config": Path(spec).stem if spec.endswith(".json") else spec, "parameters": int(m["parameters"]),
                     "bf16_tokens_per_s": m["bf16_tokens_per_s"], "fp32_tokens_per_s": m["fp32_tokens_per_s"],
                     "bf16_speedup": m["bf16_tokens_per_s"] / m["fp32_tokens_per_s"],
                     "minutes_for_budget": budget_tokens / m["bf16_tokens_per_s"] / 60})
    if out_prefix is not None:
        prefix = Path(out_prefix)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"# Training throughput by model shape (batch {batch_size} x {seq_len}, "
                 f"{torch.get_num_threads()} thread(s))", "",
                 markdown_table(["config", "params", "bf16 tok/s", "fp32 tok/s", "bf16 speed-up",
                                 f"min for {budget_tokens / 1e6:.0f}M tok"],
                                [[r["config"], f"{r['parameters'] / 1e6:.2f}M", f"{r['bf16_tokens_per_s']:.0f}",
                                  f"{r['fp32_tokens_per_s']:.0f}", f"{r['bf16_speedup']:.2f}x",
                                  f"{r['minutes_for_budget']:.0f}"] for r in rows], "llllll")]
        lines += ["", "Measured by `cinq train --measure`: full training steps (forward, backward, clipping, AdamW) on "
                      "random tokens, median over rounds in which shapes and precisions take turns (the machine is "
                      "shared with other jobs; taking turns spreads their load over every column).", ""]
        prefix.with_suffix(".md").write_text("\n".join(lines))
        prefix.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    return rows
