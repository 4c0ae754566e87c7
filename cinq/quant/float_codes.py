"""NF4 and FP8 for `cinq quantize` (``--method nf4`` / ``fp8``): the float-code formats' checkpoint tensors of one
decoder block. Both round to the nearest code without calibration (bitsandbytes and llm-compressor's FP8 schemes
do the same); only FP8 with static activation scales calibrates, for each linear's ``input_scale``: the largest
|x| its input reached over the calibration windows, / 448.
"""

from __future__ import annotations

import torch
from torch import nn

from cinq.layers.quantization.fp8 import fp8_quantize, input_scale_of
from cinq.layers.quantization.nf4 import nf4_quantize
from cinq.quant.calibration import BLOCK_LINEARS, BlockState, block_linears, capture_inputs, run_block
from cinq.quant.config import QuantConfig


def needs_calibration(cfg: QuantConfig) -> bool:
    """True when the job needs calibration text (every method but RTN, NF4 and FP8 without static scales)."""
    if cfg.method == "fp8":
        return cfg.act_scheme == "static"
    return cfg.method not in ("rtn", "nf4")


def float_code_block(block: nn.Module, state: BlockState | None, cfg: QuantConfig, batch: int,
                     dense_dtype: torch.dtype) -> tuple[dict[str, dict[str, torch.Tensor]], BlockState | None]:
    """(checkpoint tensors by linear name, next calibration state) of one float32 block."""
    lin = block_linears(block)
    fmt = cfg.target
    dtype_name = str(dense_dtype).removeprefix("torch.")
    if cfg.method == "nf4":
        return {n: {"weight" + k: v for k, v in nf4_quantize(m.weight.detach(), fmt.group_size, fmt.double_quant,
                                                            dtype_name).items()}
                for n, m in lin.items()}, None
    amax: dict[str, float] = {}
    nxt = None
    if fmt.act_scheme == "static":
        assert state is not None, "FP8 static activation scales need calibration"

        def record(name: str, x: torch.Tensor) -> None:
            amax[name] = max(amax.get(name, 0.0), float(x.float().abs().amax()))

        with capture_inputs(block, [names[0] for names in BLOCK_LINEARS], record):
            nxt = run_block(block, state, batch)
        for names in BLOCK_LINEARS:  # the linears of one input share its scale
            for n in names[1:]:
                amax[n] = amax[names[0]]
    out: dict[str, dict[str, torch.Tensor]] = {}
    for n, m in lin.items():
        q, scale = fp8_quantize(m.weight.detach(), fmt.weight_strategy)
        if fmt.format == "fp8":
            scale = scale.reshape(())  # vLLM's fp8 files: one scalar per tensor
        elif fmt.weight_strategy == "channel":
            scale = scale.reshape(-1, 1)  # compressed-tensors: [N, 1]
        t = {"weight": q, "weight_scale": scale}
        if fmt.act_scheme == "static":
            t["input_scale"] = torch.tensor([input_scale_of(amax[n])], dtype=torch.float32)
            if fmt.format == "fp8":
                t["input_scale"] = t["input_scale"].reshape(())
        out[n] = t
    return out, nxt
