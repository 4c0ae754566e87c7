"""The gated MLP activation act(gate) * up."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cinq.errors import ModelLoadError

_ACTS = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def gated_act(name: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """act(gate) * up for the configured activation name."""
    try:
        fn = _ACTS[name]
    except KeyError:
        raise ModelLoadError(f"hidden_act {name!r} is not supported ({sorted(_ACTS)})") from None
    return fn(gate) * up
