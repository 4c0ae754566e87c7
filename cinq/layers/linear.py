"""Linear layers. The model asks ``make_linear`` for each projection; what it gets back (dense, or a quantized
kind chosen from the checkpoint's ``quantization_config``) is invisible to the model code.

Contract for every linear kind: its parameters/buffers carry the checkpoint's tensor names and shapes, so the
loader fills them by name; an optional ``process_weights_after_loading()`` then repacks them for the kernel.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn


class LinearFactory(Protocol):
    """What a quantization config provides to build its linear layers."""

    def make_linear(self, in_features: int, out_features: int, bias: bool, prefix: str) -> nn.Module: ...


class DenseLinear(nn.Module):
    """y = x W^T + b with W [out_features, in_features] in the model dtype."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def make_linear(in_features: int, out_features: int, bias: bool, quant: Any = None, prefix: str = "") -> nn.Module:
    """A dense linear, or the quantized kind ``quant`` (a LinearFactory) builds for this layer."""
    if quant is None:
        return DenseLinear(in_features, out_features, bias)
    return quant.make_linear(in_features, out_features, bias, prefix)
