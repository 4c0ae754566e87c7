"""Rotary position embedding (rotate-half / NeoX layout, as in HF Llama), with Llama-3 and linear scaling.

bf16 inference on the CPU rotates q and k in place with the native kernel (cinq/kernels/cpu/rotary.cpp,
bit-identical to the PyTorch path below, which everything else runs)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from cinq.errors import ModelLoadError
from cinq.kernels.cpu_native import rotary_native


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2] in float32, after the configured scaling."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        # Llama 3.1: leave high frequencies alone, divide low ones by `factor`, interpolate smoothly between.
        factor = float(scaling["factor"])
        low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled)
    raise ModelLoadError(f"config.json: rope_scaling type {kind!r} is not supported (default, linear, llama3)")


class RotaryEmbedding(nn.Module):
    """Applies rotary embeddings to q and k given each token's absolute position."""

    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: dict[str, Any] | None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_position = max_position
        self.inv_freq = rope_inv_freq(head_dim, theta, scaling)
        self._cache: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def cos_sin(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """[max_position, head_dim] table: cos in the first half, sin in the second (computed in float32)."""
        key = (device, dtype)
        if key not in self._cache:
            t = torch.arange(self.max_position, dtype=torch.float32, device="cpu")
            freqs = torch.outer(t, self.inv_freq.cpu())
            self._cache[key] = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(device=device, dtype=dtype)
        return self._cache[key]

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [..., Hq, D], k: [..., Hkv, D], positions: [...] (same leading shape). Without autograd the result
        may be q and k themselves, rotated in place."""
        table = self.cos_sin(q.device, q.dtype)
        if rotary_native(q, k, positions, table):
            return q, k
        cs = table[positions]
        cos, sin = cs.unsqueeze(-2).chunk(2, dim=-1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
