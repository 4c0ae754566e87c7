"""SmoothQuant (Xiao et al., 2022): W8A8 with activation outliers migrated into the weights.

LLM activations have a few channels whose magnitude dwarfs the rest, so one int8 scale per token wastes most of
its range on them. With s_j = max|X_j|^alpha / max|W_j|^(1-alpha) per input channel j, X / s is much flatter
and W * s only a little rougher; dividing the preceding RMSNorm's weight by s and multiplying the consuming
linears' columns by s leaves the float model unchanged. Then weights are int8 per output channel and
activations int8 per token at run time ("dynamic") or with one calibrated scale per tensor ("static").

Smoothing is applied where it folds into a norm (q/k/v after input_layernorm, gate/up after
post_attention_layernorm); o_proj and down_proj are quantized as they are.
"""

from __future__ import annotations

import torch
from torch import nn

from cinq.layers.quantization.packing import quantize_int8_per_channel
from cinq.quant.calibration import BLOCK_LINEARS, block_linears


class AbsMaxStats:
    """max |x| per input channel of each hooked linear, over every calibration token."""

    def __init__(self) -> None:
        self.absmax: dict[str, torch.Tensor] = {}

    def __call__(self, name: str, x: torch.Tensor) -> None:
        m = x.reshape(-1, x.shape[-1]).float().abs().amax(0)
        old = self.absmax.get(name)
        self.absmax[name] = m if old is None else torch.maximum(old, m)


def smoothing_scales(act_absmax: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    """s_j = max|X_j|^alpha / max_i |W_ij|^(1 - alpha) over the linears sharing the input (clamped positive)."""
    w_absmax = torch.stack([w.float().abs().amax(0) for w in weights]).amax(0).clamp(min=1e-5)
    s = act_absmax.float().clamp(min=1e-5).pow(alpha) / w_absmax.pow(1.0 - alpha)
    return s.clamp(min=1e-5)


def smooth_block(block: nn.Module, stats: AbsMaxStats, alpha: float) -> dict[str, torch.Tensor]:
    """Fold smoothing scales into the norms and linears of ``block`` (in place). Returns each linear's input
    abs-max after smoothing (for static activation scales)."""
    lin = block_linears(block)
    after: dict[str, torch.Tensor] = {}
    pairs = ((block.input_layernorm, BLOCK_LINEARS[0]), (block.post_attention_layernorm, BLOCK_LINEARS[2]))
    with torch.no_grad():
        for norm, names in pairs:
            act = stats.absmax[names[0]]
            s = smoothing_scales(act, [lin[n].weight for n in names], alpha)
            norm.weight.div_(s.to(norm.weight.dtype))
            for n in names:
                lin[n].weight.mul_(s.to(lin[n].weight.dtype).unsqueeze(0))
                after[n] = act / s
    for names in (BLOCK_LINEARS[1], BLOCK_LINEARS[3]):
        for n in names:
            after[n] = stats.absmax[names[0]]
    return after


def w8a8_block(block: nn.Module, act_absmax: dict[str, torch.Tensor], static: bool
               ) -> dict[str, dict[str, torch.Tensor]]:
    """int8 weight, per-channel scale (and static input scale) of every linear of a smoothed block; the block's
    weights are replaced by their int8 round trip."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, linear in block_linears(block).items():
        q, scale = quantize_int8_per_channel(linear.weight.detach())
        tensors = {"weight": q, "weight_scale": scale}
        if static:
            tensors["input_scale"] = (act_absmax[name].max().clamp(min=1e-8) / 127.0).reshape(1).float()
        with torch.no_grad():
            linear.weight.copy_((q.float() * scale.unsqueeze(1)).to(linear.weight.dtype))
        out[name] = tensors
    return out


def w8a8_fake_matmul(x: torch.Tensor, w: torch.Tensor, static_scale: float | None = None) -> torch.Tensor:
    """x W^T with int8 per-channel weights and int8 per-token (or static per-tensor) activations, in float
    (the reference the tests compare the int8 kernel with)."""
    q, s_w = quantize_int8_per_channel(w)
    xf = x.float()
    if static_scale is None:
        s_x = (xf.abs().amax(-1, keepdim=True) / 127.0).clamp(min=1e-8)
    else:
        s_x = torch.tensor(static_scale)
    xq = torch.round(xf / s_x).clamp(-127, 127)
    return (xq @ q.float().t()) * s_x * s_w
