"""RMSNorm with the optional fused residual add used between decoder blocks.

bf16 inference on the CPU runs the native kernel (cinq/kernels/cpu/rms_norm.cpp: one call, rounded like the
PyTorch path below); everything else (training, float32, other devices, no kernel) runs the PyTorch path."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cinq.kernels.cpu_native import rms_norm_native


class RMSNorm(nn.Module):
    """y = w * x / rms(x), the mean square taken in float32 as in HF Llama."""

    init_weight = 1.0  # the identity scale (saver.init_random_model); a family's norm may differ (Gemma: 0)

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((hidden_size,), self.init_weight))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """With ``residual``: returns (norm(x + residual), x + residual) so blocks chain without extra adds."""
        fused = rms_norm_native(x, residual, self.weight, self.eps)
        if fused is not None:
            return fused[0] if residual is None else fused
        if residual is not None:
            x = x + residual
            residual = x
        y = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype) * self.weight
        return y if residual is None else (y, residual)
