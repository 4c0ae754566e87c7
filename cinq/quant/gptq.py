"""GPTQ (Frantar et al., 2022): quantize a linear's input channels one at a time, pushing each rounding error
onto the channels not yet quantized, weighted by the inverse Hessian of the layer's squared output error.

For a layer y = W x with calibration inputs X, the error ||(W - Q) X||^2 has Hessian H = 2 X X^T over
input channels. With U the upper Cholesky factor of H^-1, quantizing column i and updating the remaining
columns by -err_i * U[i, i:] / U[i, i] is the optimal (OBS) compensation. Updates are applied lazily: inside
a lazy batch of ``lazy_batch_size`` columns immediately, to the columns after the block once per block.

Options as in AutoGPTQ: ``damp_percent`` (of mean(diag H), added to the diagonal; multiplied by 10 and retried
when the Cholesky factorisation fails), ``desc_act`` (act-order: columns in decreasing diag(H)), and
``static_groups`` (group grids fixed from the unpermuted weight before act-order reorders the columns).
"""

from __future__ import annotations

import logging
import math

import torch

from cinq.layers.quantization.qweight import QuantizedWeight, check_grid
from cinq.quant.grid import grid_params

log = logging.getLogger(__name__)

MAX_DAMP_RETRIES = 6


class HessianAccumulator:
    """Running H = 2/n sum_t x_t x_t^T over the rows of every input seen (float64 sum would be safer for
    millions of tokens; float32 with per-batch normalisation is what GPTQ implementations use)."""

    def __init__(self, in_features: int) -> None:
        self.h = torch.zeros(in_features, in_features)
        self.count = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).float()
        m = x.shape[0]
        if m == 0:
            return
        total = self.count + m
        self.h.mul_(self.count / total)
        x = x * math.sqrt(2.0 / total)
        self.h.addmm_(x.t(), x)
        self.count = total


def _cholesky_inverse_upper(h: torch.Tensor, damp_percent: float) -> torch.Tensor:
    """Upper Cholesky factor of (H + damp I)^-1, with damping increased until the factorisations succeed."""
    mean_diag = float(torch.mean(torch.diag(h)))
    damp = damp_percent * (mean_diag if mean_diag > 0 else 1.0)
    eye = torch.eye(h.shape[0], dtype=h.dtype)
    for attempt in range(MAX_DAMP_RETRIES):
        try:
            lower = torch.linalg.cholesky(h + damp * eye)
            hinv = torch.cholesky_inverse(lower)
            return torch.linalg.cholesky(hinv, upper=True)
        except torch.linalg.LinAlgError:
            log.info("GPTQ: Cholesky failed with damp %.3g (attempt %d); increasing dampening", damp, attempt + 1)
            damp *= 10.0
    raise RuntimeError(f"GPTQ: Hessian is not positive definite even with dampening {damp:.3g}")


def gptq_quantize(w: torch.Tensor, h: torch.Tensor, bits: int = 4, group_size: int = 128, sym: bool = True,
                  desc_act: bool = False, static_groups: bool = False, damp_percent: float = 0.01,
                  lazy_batch_size: int = 128, min_zero: int = 0) -> tuple[QuantizedWeight, torch.Tensor]:
    """Quantize w [N, K] given the input Hessian h [K, K]. Returns the weight and each output row's OBS loss
    [N]. Rows are independent given h, so linears sharing an input can be quantized as one stacked matrix."""
    check_grid(bits, group_size)
    h = h.float().clone()
    n, k = w.shape
    g = k if group_size <= 0 else group_size
    maxq = (1 << bits) - 1
    wt = w.float().t().contiguous()  # [K, N]: input channel i is row i, contiguous for the column loop
    dead = torch.diag(h) == 0  # channels never active: any value is exact, pin them to 0
    h[dead, dead] = 1.0
    wt[dead] = 0.0

    static = None
    if static_groups and group_size > 0:
        static = [grid_params(wt[j:j + g].t(), bits, sym, min_zero) for j in range(0, k, g)]
    perm = torch.argsort(torch.diag(h), descending=True) if desc_act else torch.arange(k)
    wt = wt[perm]
    h = h[perm][:, perm]
    u = _cholesky_inverse_upper(h, damp_percent)

    q_perm = torch.empty(k, n, dtype=torch.uint8)
    group_of_pos = torch.empty(k, dtype=torch.long)  # group id of each permuted position
    scales: list[torch.Tensor] = []
    zeros: list[torch.Tensor] = []
    scale = zero = None
    loss = torch.zeros(n)
    perm_list = perm.tolist()
    for b0 in range(0, k, lazy_batch_size):
        b1 = min(b0 + lazy_batch_size, k)
        wb = wt[b0:b1].clone()
        errs = torch.zeros_like(wb)
        ub = u[b0:b1, b0:b1]
        for i in range(b1 - b0):
            pos = b0 + i
            if static is not None:
                gid = perm_list[pos] // g
                scale, zero = static[gid]
                zero_f = zero.float()
            else:
                if pos % g == 0:
                    # The group's current values: in-block rows carry this block's updates already.
                    rows = torch.cat([wb[i:i + g], wt[b1:b1 + g]])[:g]
                    scale, zero = grid_params(rows.t(), bits, sym, min_zero)
                    zero_f = zero.float()
                    scales.append(scale)
                    zeros.append(zero)
                gid = pos // g
            col = wb[i]
            q = torch.clamp(torch.round(col / scale) + zero_f, 0, maxq)
            diff = col - scale * (q - zero_f)
            q_perm[pos] = q.to(torch.uint8)
            group_of_pos[pos] = gid
            d = ub[i, i]
            loss += diff * diff / (2 * d * d)
            err = diff / d
            wb[i:].addr_(ub[i, i:], err, alpha=-1.0)
            errs[i] = err
        wt[b1:].addmm_(u[b0:b1, b1:].t(), errs, alpha=-1.0)

    inv = torch.argsort(perm)
    qweight = q_perm[inv].t().contiguous()
    g_idx = group_of_pos[inv]
    if static is not None:
        scales_t = torch.stack([s for s, _ in static])
        zeros_t = torch.stack([z for _, z in static])
    else:
        scales_t = torch.stack(scales)
        zeros_t = torch.stack(zeros)
    return QuantizedWeight(qweight, scales_t, zeros_t.to(torch.int32), g_idx.to(torch.int32), bits, group_size), loss


def _quantize_group(names: tuple[str, ...], h: torch.Tensor, lin: dict, masters: dict[str, torch.Tensor] | None,
                    grid: tuple, weights: dict[str, QuantizedWeight], losses: dict[str, float]) -> None:
    """GPTQ the linears ``names`` (one input, one Hessian ``h``) as one stacked matrix; split the result back
    into ``weights`` / ``losses`` and leave each linear holding its dequantized weight."""
    from cinq.quant.calibration import set_weight
    ws = [(masters[n] if masters is not None else lin[n].weight.detach()).float() for n in names]
    qw, row_loss = gptq_quantize(torch.cat(ws), h, *grid)
    lo = 0
    for n, w in zip(names, ws):
        part = qw.rows(lo, lo + w.shape[0])
        losses[n] = float(row_loss[lo:lo + w.shape[0]].sum())
        lo += w.shape[0]
        set_weight(lin[n], part.dequantize())
        weights[n] = part


def gptq_block(block: torch.nn.Module, state, bits: int, group_size: int, sym: bool, desc_act: bool,
               static_groups: bool, damp_percent: float, lazy_batch_size: int, true_sequential: bool, batch: int = 8,
               min_zero: int = 0, masters: dict[str, torch.Tensor] | None = None, staged: bool = True
               ) -> tuple[dict[str, QuantizedWeight], dict[str, float]]:
    """GPTQ every linear of a decoder ``block`` on the calibration ``state`` (a calibration.BlockState).

    True-sequential: q/k/v, then o, then gate/up, then down, each group's Hessian taken from the inputs the
    already-quantized linears before it produce (``gptq_block_staged``). Linears that read the same input share
    its Hessian and are quantized as one stacked matrix. ``masters`` holds float32 weights by local name when
    the block itself runs in a lower calibration dtype. The block's weights are left dequantized, ready to
    produce the next block's inputs. ``staged`` False re-runs the block up to each stage instead (the reference
    the staged path is tested against)."""
    from cinq.model.llama import LlamaDecoderLayer
    if staged and true_sequential and type(block) is LlamaDecoderLayer:
        weights, losses, _ = gptq_block_staged(block, state, bits, group_size, sym, desc_act, static_groups,
                                               damp_percent, lazy_batch_size, batch, min_zero, masters)
        return weights, losses
    from cinq.quant.calibration import BLOCK_LINEARS, block_linears, capture_inputs, run_block

    lin = block_linears(block)
    stages = BLOCK_LINEARS if true_sequential else (tuple(n for names in BLOCK_LINEARS for n in names),)
    grid = (bits, group_size, sym, desc_act, static_groups, damp_percent, lazy_batch_size, min_zero)
    weights: dict[str, QuantizedWeight] = {}
    losses: dict[str, float] = {}
    for stage in stages:
        groups = [names for names in BLOCK_LINEARS if names[0] in stage]
        hooked = [names[0] for names in groups]
        accs = {key: HessianAccumulator(lin[key].in_features) for key in hooked}
        with capture_inputs(block, hooked, lambda name, x, accs=accs: accs[name].add(x), stop_after=hooked[-1]):
            run_block(block, state, batch, keep_output=False)
        for names in groups:
            _quantize_group(names, accs[names[0]].h, lin, masters, grid, weights, losses)
    return weights, losses


def gptq_block_staged(block: torch.nn.Module, state, bits: int, group_size: int, sym: bool, desc_act: bool,
                      static_groups: bool, damp_percent: float, lazy_batch_size: int, batch: int = 8,
                      min_zero: int = 0, masters: dict[str, torch.Tensor] | None = None):
    """True-sequential GPTQ of a LlamaDecoderLayer computing each piece of the block once: its inputs are kept
    between the stages (normed input -> q/k/v, attention output -> o, normed residual -> gate/up, gated
    activation -> down), where re-running the block up to each stage's linears would compute attention three
    more times. Same values as the re-running loop, batch by batch. Returns (weights, losses, the next block's
    calibration state). Extra memory: about three hidden-sized activations of the calibration set."""
    from cinq.quant.calibration import BLOCK_LINEARS, BlockState, StopForward, block_linears, capture_inputs

    lin = block_linears(block)
    grid = (bits, group_size, sym, desc_act, static_groups, damp_percent, lazy_batch_size, min_zero)
    weights: dict[str, QuantizedWeight] = {}
    losses: dict[str, float] = {}
    (qkv, o, gate_up, down) = BLOCK_LINEARS
    n = state.hidden.shape[0]
    parts = [slice(lo, lo + batch) for lo in range(0, n, batch)]

    def quantize(names: tuple[str, ...], inputs: list[torch.Tensor]) -> None:
        acc = HessianAccumulator(lin[names[0]].in_features)
        for x in inputs:
            acc.add(x)
        _quantize_group(names, acc.h, lin, masters, grid, weights, losses)

    def inputs_of(name: str, module: torch.nn.Module, batches: list[tuple]) -> list[torch.Tensor]:
        """The input of linear ``name`` for every batch of ``module(*args)``, each run stopped once it is seen."""
        seen: list[torch.Tensor] = []
        with capture_inputs(block, [name], lambda _n, x: seen.append(x), stop_after=name):
            for args in batches:
                try:
                    module(*args)
                except StopForward:
                    pass
        return seen

    with torch.inference_mode():
        x1, res1 = [], []
        for p in parts:  # LlamaDecoderLayer.forward, step by step
            h = state.hidden[p]
            if state.residual is None:
                x1.append(block.input_layernorm(h))
                res1.append(h)
            else:
                x, r = block.input_layernorm(h, state.residual[p])
                x1.append(x)
                res1.append(r)
        quantize(qkv, x1)
        attn_out = inputs_of(o[0], block.self_attn, [(state.positions[p], x, None) for p, x in zip(parts, x1)])
        del x1
        quantize(o, attn_out)
        x2, res2 = [], []
        for a, r in zip(attn_out, res1):
            x, r2 = block.post_attention_layernorm(lin[o[0]](a), r)
            x2.append(x)
            res2.append(r2)
        del attn_out, res1
        quantize(gate_up, x2)
        act = inputs_of(down[0], block.mlp, [(x,) for x in x2])
        del x2
        quantize(down, act)
        out = torch.cat([lin[down[0]](m) for m in act])
    return weights, losses, BlockState(out, torch.cat(res2), state.positions)
