"""Linear layers. The model asks ``make_linear`` for each projection; what it gets back (dense, or a quantized
kind chosen from the checkpoint's ``quantization_config``) is invisible to the model code.

Contract for every linear kind: its parameters/buffers carry the checkpoint's tensor names and shapes, so the
loader fills them by name; an optional ``process_weights_after_loading()`` then repacks them for the kernel.

Kinds: ``DenseLinear``; ``GPTQLinear`` (GPTQ v1/v2 files, 4/8-bit weight-only: RTN and GPTQ write these),
``AWQLinear`` (AWQ GEMM files) and ``W8A8Linear`` (SmoothQuant). The quantized ones unpack their checkpoint
tensors once, hand them to the kernel chosen for the device and shape (cinq/quant/kernels.py), and keep only
the kernel's tensors.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from cinq.errors import ModelLoadError
from cinq.kernels.cpu_native import small_m_linear_native
from cinq.quant.formats import awq_shapes, awq_unpack, gptq_shapes, gptq_unpack
from cinq.quant.kernels import Prepared, prepare_weight_only, w8a8_mm, weight_only_mm


class LinearFactory(Protocol):
    """What a quantization config provides to build its linear layers."""

    def make_linear(self, in_features: int, out_features: int, bias: bool, prefix: str) -> nn.Module: ...


class DenseLinear(nn.Module):
    """y = x W^T + b with W [out_features, in_features] in the model dtype. Decode-sized bf16 inputs on the CPU
    (at most SMALL_M_MAX_ROWS rows, no autograd) go through the native skinny kernel when it is available."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.bfloat16 and x.device.type == "cpu" and not torch.is_grad_enabled():
            y = small_m_linear_native(x, self.weight, self.bias)
            if y is not None:
                return y
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def make_linear(in_features: int, out_features: int, bias: bool, quant: Any = None, prefix: str = "") -> nn.Module:
    """A dense linear, or the quantized kind ``quant`` (a LinearFactory) builds for this layer."""
    if quant is None:
        return DenseLinear(in_features, out_features, bias)
    return quant.make_linear(in_features, out_features, bias, prefix)


# --------------------------------------------------------------------------------------- quantized linears


class QuantizedLinear(nn.Module):
    """Shared plumbing: checkpoint tensors as buffers, replaced after loading by the kernel's own tensors."""

    def __init__(self, in_features: int, out_features: int, bias: bool, prefix: str) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.prefix = prefix
        # The loader builds the model under the target default dtype: remember it as the compute dtype.
        self.compute_dtype = torch.get_default_dtype()
        self.kind = "unloaded"
        self.group = 0
        if bias:
            self.register_buffer("bias", torch.empty(out_features))
        else:
            self.bias = None

    def _install(self, prepared: Any, drop: tuple[str, ...]) -> None:
        for name in drop:
            delattr(self, name)
        for name, t in prepared.tensors.items():
            self.register_buffer(name, t, persistent=False)
        self.kind = prepared.kind
        self.group = prepared.arg

    def _kernel_tensors(self) -> dict[str, torch.Tensor]:
        """The kernel's tensors by name: the module's buffer dict itself (no copy on the hot path)."""
        if self.kind == "unloaded":
            raise RuntimeError(f"{self.prefix or type(self).__name__}: process_weights_after_loading() has not run")
        return self._buffers

    def _add_bias(self, y: torch.Tensor) -> torch.Tensor:
        b = self.bias
        return y if b is None else y + (b if b.dtype == y.dtype else b.to(y.dtype))

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"kernel={self.kind}")


def _packed_dims(prefix: str, what: str, size: int, bits: int) -> int:
    per = 32 // bits
    if size % per:
        raise ModelLoadError(f"{prefix}: {what} {size} is not a multiple of {per}, so {bits}-bit weights cannot be "
                             f"packed into int32 words")
    return size // per


class GPTQLinear(QuantizedLinear):
    """A linear stored as GPTQ v1/v2 tensors (qweight, qzeros, scales, g_idx); 4 or 8 bits."""

    def __init__(self, in_features: int, out_features: int, bias: bool, bits: int, group_size: int,
                 version: int = 1, prefix: str = "") -> None:
        super().__init__(in_features, out_features, bias, prefix)
        self.bits, self.group_size, self.version = bits, group_size, version
        _packed_dims(prefix, "in_features", in_features, bits)
        _packed_dims(prefix, "out_features", out_features, bits)
        shapes = gptq_shapes(in_features, out_features, bits, group_size)
        self.register_buffer("qweight", torch.empty(shapes["qweight"], dtype=torch.int32))
        self.register_buffer("qzeros", torch.empty(shapes["qzeros"], dtype=torch.int32))
        self.register_buffer("scales", torch.empty(shapes["scales"], dtype=torch.float16))
        self.register_buffer("g_idx", torch.empty(shapes["g_idx"], dtype=torch.int32))

    def quantized_weight(self) -> Any:
        """The checkpoint tensors unpacked (before ``process_weights_after_loading``)."""
        t = {"qweight": self.qweight, "qzeros": self.qzeros, "scales": self.scales, "g_idx": self.g_idx}
        return gptq_unpack(t, self.bits, self.group_size, self.version, name=self.prefix)

    def process_weights_after_loading(self) -> None:
        qw = self.quantized_weight()
        prepared = prepare_weight_only(qw, self.qweight.device, self.compute_dtype, self.prefix)
        self._install(prepared, ("qweight", "qzeros", "scales", "g_idx"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._add_bias(weight_only_mm(self.kind, self._kernel_tensors(), self.group, x))


class AWQLinear(QuantizedLinear):
    """A linear stored as AWQ GEMM tensors (qweight, qzeros, scales); 4 bits."""

    def __init__(self, in_features: int, out_features: int, bias: bool, group_size: int, prefix: str = "") -> None:
        super().__init__(in_features, out_features, bias, prefix)
        self.bits, self.group_size = 4, group_size
        _packed_dims(prefix, "out_features", out_features, 4)
        g = in_features if group_size <= 0 else group_size
        if in_features % g:
            raise ModelLoadError(f"{prefix}: in_features {in_features} is not a multiple of group_size {g} (AWQ)")
        shapes = awq_shapes(in_features, out_features, group_size)
        self.register_buffer("qweight", torch.empty(shapes["qweight"], dtype=torch.int32))
        self.register_buffer("qzeros", torch.empty(shapes["qzeros"], dtype=torch.int32))
        self.register_buffer("scales", torch.empty(shapes["scales"], dtype=torch.float16))

    def quantized_weight(self) -> Any:
        t = {"qweight": self.qweight, "qzeros": self.qzeros, "scales": self.scales}
        return awq_unpack(t, self.group_size, name=self.prefix)

    def process_weights_after_loading(self) -> None:
        qw = self.quantized_weight()
        prepared = prepare_weight_only(qw, self.qweight.device, self.compute_dtype, self.prefix)
        self._install(prepared, ("qweight", "qzeros", "scales"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._add_bias(weight_only_mm(self.kind, self._kernel_tensors(), self.group, x))


class W8A8Linear(QuantizedLinear):
    """int8 weights (per channel) x int8 activations (per token, or per tensor when ``static``): SmoothQuant."""

    def __init__(self, in_features: int, out_features: int, bias: bool, static: bool = False,
                 prefix: str = "") -> None:
        super().__init__(in_features, out_features, bias, prefix)
        self.static = static
        self.register_buffer("weight", torch.empty(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.empty(out_features, dtype=torch.float32))
        if static:
            self.register_buffer("input_scale", torch.empty(1, dtype=torch.float32))
        else:
            self.input_scale = None

    def process_weights_after_loading(self) -> None:
        if self.static and not (float(self.input_scale) > 0):
            raise ModelLoadError(f"{self.prefix}.input_scale must be positive, got {float(self.input_scale)}")
        tensors = {"w_t": self.weight.t().contiguous(), "w_scale": self.weight_scale.float()}
        if self.static:
            tensors["input_scale"] = self.input_scale.float()
        drop = ("weight", "weight_scale") + (("input_scale",) if self.static else ())
        self._install(Prepared("w8a8", tensors), drop)
        if not self.static:
            self.input_scale = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self._kernel_tensors()
        return self._add_bias(w8a8_mm(x, t["w_t"], t["w_scale"], t.get("input_scale")))
