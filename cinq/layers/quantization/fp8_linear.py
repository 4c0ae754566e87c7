"""``FP8Linear``: a linear stored as float8_e4m3fn weights with per-tensor or per-channel ``weight_scale`` (vLLM's
``fp8`` method, compressed-tensors' float-quantized scheme), activations dynamic per token, static per tensor
(``input_scale``) or not quantized (weight-only). fp8.py has the arithmetic.

Merged shards keep their own scales: a per-tensor scale becomes that shard's channels' scale (no requantization,
unlike vLLM which requantizes to the shards' largest); static input scales take the largest (as W8A8Linear).

Kernels: ``fp8_native`` (CPU, bf16): cinq/kernels/cpu/float_code_linear.cpp decodes the e4m3 bytes in registers,
the weights staying 1 byte per value; past ``NATIVE_MAX_ROWS`` rows the weight is widened per call for oneDNN's
matmul. ``fp8_scaled_mm`` (CUDA, FP8 tensor cores) / ``fp8_dequant`` (other GPUs, weight-only):
``fp8.cuda_kind``. ``dequantized_at_load`` elsewhere (float32 parity runs, no native build).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cinq.errors import ModelLoadError
from cinq.layers.linear_split import LinearSplit
from cinq.layers.quantization import kernels
from cinq.layers.quantization.collected_linear import CollectedLinear, check_size
from cinq.layers.quantization.fp8 import E4M3, cuda_kind, fp8_dequantize, quantize_input, scaled_mm
from cinq.layers.weight_loader import OutputShards


class FP8Linear(CollectedLinear):
    """e4m3 weights, ``act_scheme`` "dynamic" | "static" | "none" (weight-only)."""

    format_name = "FP8"

    def __init__(self, in_features: int, out_features: int, bias: bool, act_scheme: str = "dynamic",
                 prefix: str = "", *, compute_dtype: torch.dtype, output_shards: OutputShards | None = None,
                 split: LinearSplit | None = None) -> None:
        names = ("weight", "weight_scale") + (("input_scale",) if act_scheme == "static" else ())
        super().__init__(in_features, out_features, bias, prefix, compute_dtype, output_shards, split, names)
        self.act_scheme = act_scheme

    def fp8_weight(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(codes e4m3 [N, K], scale float32 [N], input scale [1] or None) of the loaded shards."""
        codes, scales, inputs = [], [], []
        for where, size, t in self.shard_parts():
            w = t["weight"]
            if w.dtype not in (E4M3, torch.uint8):
                raise ModelLoadError(f"checkpoint tensor '{where}.weight': dtype {w.dtype}, FP8 weights are "
                                     f"float8_e4m3fn")
            if tuple(w.shape) != (size, self.in_features):
                raise ModelLoadError(f"checkpoint tensor '{where}.weight': shape {tuple(w.shape)}, the model needs "
                                     f"{(size, self.in_features)}")
            s = t["weight_scale"].float().reshape(-1)
            if s.numel() not in (1, size):
                raise ModelLoadError(f"checkpoint tensor '{where}.weight_scale': {s.numel()} values, 1 (per tensor) "
                                     f"or {size} (per channel)")
            codes.append(w.view(E4M3))
            scales.append(s.expand(size))
            if self.act_scheme == "static":
                a = t["input_scale"].float().reshape(-1)
                check_size(where, "input_scale", a, 1)
                if not float(a) > 0:
                    raise ModelLoadError(f"{where}.input_scale must be positive, got {float(a)}")
                inputs.append(a)
        inp = torch.stack(inputs).amax().reshape(1) if inputs else None
        return torch.cat(codes), torch.cat(scales).contiguous(), inp

    def process_weights_after_loading(self) -> None:
        codes, scale, inp = self.fp8_weight()
        device, dtype = self.weight.device, self.compute_dtype
        t = {"codes": codes.to(device), "scale": scale.to(device)}
        if inp is not None:
            t["input_scale"] = inp.to(device)
        kind = None
        if kernels._FORCE_DEQUANTIZED_AT_LOAD:
            pass
        elif device.type == "cpu" and dtype == torch.bfloat16 and self.in_features % 16 == 0:
            from cinq.layers.quantization.native_float import float_kernels_available
            if float_kernels_available():
                kind = "fp8_native"
                t["codes"] = t["codes"].view(torch.uint8)
        elif device.type == "cuda":
            cap = torch.cuda.get_device_capability(device)
            kind = cuda_kind(cap, self.out_features, self.in_features, self.act_scheme,
                             hasattr(torch, "_scaled_mm"))
            if kind == "fp8_scaled_mm":
                t["scale_row"] = scale.reshape(1, -1).to(device)
        if kind is None:
            if not kernels._FORCE_DEQUANTIZED_AT_LOAD:
                kernels.say_once(f"FP8 weights: no FP8 kernel for {dtype} on {device.type}; dequantized once at "
                                 f"load (same values, dense speed and memory)")
            kind = kernels.DEQUANTIZED_AT_LOAD
            t = {"weight": fp8_dequantize(codes, scale).to(device=device, dtype=dtype),
                 **({"input_scale": t["input_scale"]} if inp is not None else {})}
        self._finish(t, kind)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self._kernel_tensors()
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, k)
        xs = None
        if self.act_scheme != "none":
            xq, xs = quantize_input(x2, t.get("input_scale"))
            if self.kind == "fp8_scaled_mm":
                y = scaled_mm(xq, xs, t["codes"], t["scale_row"], x.dtype if x.dtype != torch.float32
                              else torch.bfloat16)
                return self._add_bias(y.to(x.dtype).reshape(*lead, -1))
            x2 = xq.to(torch.bfloat16 if self.kind == "fp8_native" else self.compute_dtype)  # exact
        if self.kind == "fp8_native" and x2.shape[0] <= kernels.NATIVE_MAX_ROWS:
            from cinq.layers.quantization.native_float import fp8_linear
            y = fp8_linear(x2, t["codes"], t["scale"], None if xs is None else xs.reshape(-1))
        else:
            if self.kind == kernels.DEQUANTIZED_AT_LOAD:
                w = t["weight"]
            else:  # fp8_native past its rows, fp8_dequant: widen the weight for this call
                w = fp8_dequantize(t["codes"].view(E4M3), t["scale"]).to(x2.dtype if x2.is_floating_point()
                                                                        else self.compute_dtype)
            y = F.linear(x2.to(w.dtype), w)
            if xs is not None:
                y = y * xs.to(y.dtype)
        y = y if y.dtype == x.dtype else y.to(x.dtype)
        return self._add_bias(y.reshape(*lead, -1))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fp8 activations={self.act_scheme}"
