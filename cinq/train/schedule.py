"""Learning-rate schedule: linear warmup, a constant phase, then a cosine decay to a floor.

``decay_frac = 1`` is the classic warmup + cosine. With ``decay_frac < 1`` (warmup-stable-decay, as in MiniCPM
and Hägele et al. 2024) the learning rate before the decay does not depend on the total, so a run's token
budget can still be changed while it is in the constant phase and it follows exactly the trajectory of a run
planned with the new budget from the start.
"""

from __future__ import annotations

import math


def decay_start(total_steps: int, warmup_steps: int, decay_frac: float = 1.0) -> int:
    """The first step whose learning rate depends on ``total_steps``."""
    return max(warmup_steps, total_steps - math.ceil(decay_frac * (total_steps - warmup_steps)))


def lr_at(step: int, total_steps: int, peak_lr: float, warmup_steps: int, min_lr_ratio: float = 0.1,
          decay_frac: float = 1.0) -> float:
    """lr(step) = peak * (step + 1) / warmup during warmup; peak until the decay starts; then
    min + (peak - min) * (1 + cos(pi * progress)) / 2, progress going 0 -> 1 over the decay steps."""
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    start = decay_start(total_steps, warmup_steps, decay_frac)
    if step < start:
        return peak_lr
    span = max(1, total_steps - start)
    progress = min(1.0, (step - start) / span)
    floor = peak_lr * min_lr_ratio
    return floor + (peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
