"""AWQ (Lin et al., 2023): protect the weights that meet large activations by scaling them up before rounding.

For each group of linears that read the same input x (q/k/v, gate/up; o after v and down after up when the
scale can be folded exactly), with s_x the mean |x| per input channel:

1. grid search alpha in {0, 1/n, ..., (n-1)/n}: s = s_x^alpha (normalised to geometric mean 1); quantize W * s,
   divide by s again, and measure the error of the group's output (the attention block, the MLP, or the
   linear itself) against the float output on the calibration windows; keep the best s;
2. fold: W[:, j] *= s_j in the linears, and divide the operation that produces x by s (the preceding RMSNorm's
   weight, or the rows of v_proj / up_proj), so the float block computes exactly what it did before;
3. clip search: per (output channel, group), shrink the grid's range by r in {1, 1 - 1/n, ..., 0.5} and keep the
   r with the smallest output error on a sample of tokens (skipped for q/k, whose errors attention amplifies);
4. RTN with the chosen clipping, asymmetric groups by default (AWQ's zero-point format).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from cinq.layers.quantization.qweight import QuantizedWeight
from cinq.quant.calibration import BLOCK_LINEARS, block_linears, set_weight
from cinq.quant.grid import grid_from_range, quantize_with
from cinq.quant.rtn import fake_quantize, rtn_quantize

CLIP_MAX_SHRINK = 0.5
CLIP_TOKENS = 512


class AWQStats:
    """Per input group: summed |x| per channel over all windows, and the first ``keep_windows`` windows' x."""

    def __init__(self, keep_windows: int) -> None:
        self.keep = keep_windows
        self.abs_sum: dict[str, torch.Tensor] = {}
        self.count: dict[str, int] = {}
        self.kept: dict[str, list[torch.Tensor]] = {}

    def __call__(self, name: str, x: torch.Tensor) -> None:
        flat = x.reshape(-1, x.shape[-1]).float()
        self.abs_sum[name] = self.abs_sum.get(name, 0) + flat.abs().sum(0)
        self.count[name] = self.count.get(name, 0) + flat.shape[0]
        kept = self.kept.setdefault(name, [])
        have = sum(t.shape[0] for t in kept)
        if have < self.keep:
            kept.append(x[: self.keep - have].float().clone())

    def mean_abs(self, name: str) -> torch.Tensor:
        return self.abs_sum[name] / self.count[name]

    def inputs(self, name: str) -> torch.Tensor:
        return torch.cat(self.kept[name])


def _search_scale(module: nn.Module, names: list[str], originals: list[torch.Tensor], x: torch.Tensor,
                  x_mean: torch.Tensor, call: Callable[[nn.Module, torch.Tensor], torch.Tensor], bits: int,
                  group_size: int, sym: bool, n_grid: int, dtype: torch.dtype, min_zero: int = 0
                  ) -> tuple[torch.Tensor, float, float]:
    """Best s for the linears ``names`` inside ``module`` (whose float32 weights are ``originals``): the
    search runs on a ``dtype`` copy of the module. Returns (s, alpha, loss); alpha 0 (plain RTN) is a candidate.

    bf16 is enough to rank the candidates: its rounding (~0.4%) is far below a 4-bit grid step (~7%)."""
    probe = copy.deepcopy(module).to(dtype)
    linears = [probe.get_submodule(n) if n else probe for n in names]
    xd = x.to(dtype)
    with torch.inference_mode():
        target = call(probe, xd).float()
        best = (torch.ones_like(x_mean), 0.0, float("inf"))
        for i in range(n_grid):
            alpha = i / n_grid
            s = x_mean.pow(alpha).clamp(min=1e-4)
            s = s / (s.max() * s.min()).sqrt()
            for lin, w in zip(linears, originals):
                set_weight(lin, fake_quantize(w * s, bits, group_size, sym, min_zero).div_(s))
            loss = float((call(probe, xd).float() - target).pow(2).mean())
            if loss < best[2]:
                best = (s.clone(), alpha, loss)
    return best


def _fold(prev: nn.Module, linears: list[nn.Module], s: torch.Tensor) -> None:
    """x -> x / s at the producer, W[:, j] -> W[:, j] * s_j in the consumers: the float function is unchanged."""
    with torch.no_grad():
        if hasattr(prev, "eps"):  # RMSNorm: y = w * normalize(x)
            prev.weight.div_(s.to(prev.weight.dtype))
        else:  # a linear producing x: scale its output rows
            prev.weight.div_(s.to(prev.weight.dtype).unsqueeze(1))
            if getattr(prev, "bias", None) is not None:
                prev.bias.div_(s.to(prev.bias.dtype))
        for lin in linears:
            lin.weight.mul_(s.to(lin.weight.dtype).unsqueeze(0))


def search_clip(w: torch.Tensor, x: torch.Tensor, bits: int, group_size: int, sym: bool, n_grid: int,
                min_zero: int = 0) -> torch.Tensor:
    """Per (group, output channel) range shrink ratio [num_groups, N] minimising that group's partial output
    error on tokens x [T, K]."""
    n, k = w.shape
    g = k if group_size <= 0 else group_size
    ng = k // g
    wg = w.float().reshape(n, ng, g)
    xg = x.float().reshape(-1, ng, g)  # [T, ng, g]
    ref = torch.einsum("ngc,tgc->ngt", wg, xg)
    lo, hi = wg.amin(-1), wg.amax(-1)  # [N, ng]
    best_err = torch.full((n, ng), float("inf"))
    best_r = torch.ones(n, ng)
    for i in range(int(CLIP_MAX_SHRINK * n_grid) + 1):
        r = 1.0 - i / n_grid
        scale, zero = grid_from_range((lo * r).reshape(-1), (hi * r).reshape(-1), bits, sym, min_zero)
        q = quantize_with(wg.reshape(-1, g), scale, zero, bits)
        deq = (scale.unsqueeze(1) * (q.float() - zero.unsqueeze(1).float())).reshape(n, ng, g)
        err = (torch.einsum("ngc,tgc->ngt", deq, xg) - ref).pow(2).mean(-1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_r = torch.where(better, torch.full_like(best_r, r), best_r)
    return best_r.t().contiguous()


def awq_block(block: nn.Module, stats: AWQStats, positions: torch.Tensor, bits: int, group_size: int,
              sym: bool, n_grid: int, clip: bool, min_zero: int = 0,
              search_dtype: torch.dtype = torch.bfloat16) -> dict[str, QuantizedWeight]:
    """Scale, fold, clip and quantize every linear of a float32 ``block`` (modified in place: norms and
    weights carry the folded scales, linears end up holding their dequantized weights). Returns the quantized
    weights by local name."""
    lin = block_linears(block)
    attn = block.self_attn
    pos = positions[: stats.inputs(BLOCK_LINEARS[0][0]).shape[0]]

    def attn_call(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(pos, x, None)

    def plain_call(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x)
    # (producer of x, consumers, module whose output is compared, its call, consumer names inside it)
    groups = [
        (block.input_layernorm, BLOCK_LINEARS[0], attn, attn_call, ["q_proj", "k_proj", "v_proj"]),
        (lin["self_attn.v_proj"], BLOCK_LINEARS[1], lin["self_attn.o_proj"], plain_call, [""]),
        (block.post_attention_layernorm, BLOCK_LINEARS[2], block.mlp, plain_call, ["gate_proj", "up_proj"]),
        (lin["mlp.up_proj"], BLOCK_LINEARS[3], lin["mlp.down_proj"], plain_call, [""]),
    ]
    scales_in: dict[str, torch.Tensor] = {}
    for prev, names, module, call, inner in groups:
        # v -> o folds exactly only when o's inputs are v's outputs one to one (no grouped-query sharing).
        if prev is lin["self_attn.v_proj"] and attn.num_heads != attn.num_kv_heads:
            continue
        linears = [lin[n] for n in names]
        originals = [m.weight.detach().float().clone() for m in linears]
        s, _alpha, _loss = _search_scale(module, inner, originals, stats.inputs(names[0]),
                                         stats.mean_abs(names[0]), call, bits, group_size, sym, n_grid,
                                         search_dtype, min_zero)
        _fold(prev, linears, s)
        for n in names:
            scales_in[n] = s
    out: dict[str, QuantizedWeight] = {}
    for names in BLOCK_LINEARS:
        x = stats.inputs(names[0])
        x = x.reshape(-1, x.shape[-1])
        if names[0] in scales_in:
            x = x / scales_in[names[0]]
        step = max(1, x.shape[0] // CLIP_TOKENS)
        sample = x[::step][:CLIP_TOKENS]
        for n in names:
            w = lin[n].weight.detach().float()
            ratio = None
            if clip and n not in ("self_attn.q_proj", "self_attn.k_proj") and group_size > 0 \
                    and w.shape[1] % group_size == 0:
                ratio = search_clip(w, sample, bits, group_size, sym, n_grid, min_zero)
            qw = rtn_quantize(w, bits, group_size, sym, min_zero, clip_ratio=ratio)
            out[n] = qw
            set_weight(lin[n], qw.dequantize())
    return out
