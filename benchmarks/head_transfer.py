"""How well EAGLE heads draft for a target they may not have been trained on (a quantized copy of their target,
say), measured offline: the target writes greedy continuations of the given prompts in float32, then each head's
acceptance is scored on them (cinq/eval/spec_acceptance.py: tau along the speculative walk, acceptance per
depth). Deterministic and free of timing, and over more tokens than a served run affords on a shared CPU, so
small differences in draft quality show that served tau at a few prompts would blur."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cinq.eval.spec_acceptance import measure
from cinq.spec.eagle import load_eagle_head
from cinq.train.distill import load_teacher
from cinq.train.generation import generate_naive
from cinq.train.spec_head_data import TargetSequences
from cinq.train.spec_heads import held_out_batches


def held_out_acceptance(target_dir: str | Path, heads: dict[str, Path], prompts: list[list[int]], max_tokens: int,
                        k: int) -> dict[str, dict[str, Any]]:
    """name -> {tau, accept_rate, steps, ...} of each head in ``heads`` on ``target_dir``'s greedy continuations
    (``max_tokens`` each, stopping at its end-of-sequence tokens) of ``prompts``."""
    target = load_teacher(target_dir)
    outs = generate_naive(target, prompts, max_tokens, 0.0, eos_ids=list(target.config.eos_token_ids))
    seqs = TargetSequences.from_lists([p + o for p, o in zip(prompts, outs)], [len(p) for p in prompts],
                                      ["held-out"] * len(prompts))
    batches = held_out_batches(seqs)
    out = {}
    for name, folder in heads.items():
        head = load_eagle_head(folder, target, torch.float32, "cpu", "sdpa").eval()
        out[name] = measure(head, target, batches, k)["all"]
    return out
