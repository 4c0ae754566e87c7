"""``GGUFLinear``: a linear whose weight is a GGUF file's own Q8_0 / Q4_0 / Q4_1 / Q4_K blocks, served without
requantizing (cinq/layers/quantization/gguf_blocks.py has the layouts).

It loads the blocks as bytes (``weight``: uint8 [N, K / 32 * block bytes]; a merged projection's shards are whole
rows, so they concatenate like dense ones), then ``process_weights_after_loading`` decodes them once and hands them
to the kernel: for bf16 on the CPU, cinq's native grouped kernels (int8 with one scale per 32-value block for Q8_0;
4-bit with a float32 scale and offset per block for Q4_0 / Q4_1: Q4_1's minimum is not an integer zero point, so
the kernel takes the affine form W = scale * q + offset rather than GPTQ's scale * (q - zero)); with int8
activations (``int8_activations``, the default) the int8-activation kernels on the blocks' own fp16 scales. Elsewhere (float32
parity runs, CUDA, no native build) the exact values are dequantized once to the compute dtype and run dense; the
log says so once.
"""

from __future__ import annotations

import torch

from cinq.errors import InvalidParameterError
from cinq.kernels.cpu_native import bf16_gemm_is_emulated
from cinq.kernels.prefill_gemm import WeightRows, dequant_linear
from cinq.layers.linear_split import LinearSplit
from cinq.layers.quantization.gguf_blocks import (BLOCK, BLOCK_BYTES, K_BLOCK_BYTES, decode_blocks,
                                                  q4_k_affine, row_bytes, values_per_block)
from cinq.layers.quantization.int8_activations import (
    int4_affine_linear_i8,
    int8_activations,
    int8_grouped_linear_i8,
)
from cinq.layers.quantization.kernels import DEQUANTIZED_AT_LOAD, Prepared, say_once, weight_only_mm
from cinq.layers.quantization.linear import QuantizedLinear
from cinq.layers.quantization.native import I8_DEQUANT_ROWS, bf16_weight_rows, int4_codes_float, rows_of
from cinq.layers.weight_loader import OutputShards, ParamLayout

_ROWS = ParamLayout(output_dim=0)
# From this many rows (prefill chunks, wide decode batches) an int8-activation layer dequantizes its blocks, a block
# of output rows at a time, for a GEMM (``prefill_gemm.dequant_linear``), as native.I8_DEQUANT_ROWS says: where
# the bf16 GEMM is emulated, the float32 GEMM from 512 rows, and Q8_0 keeps its kernel at any rows (no float32 GEMM
# was measured ahead of it); with bf16 instructions, the bf16 GEMM from 256 rows on blocks dequantized to bf16 in
# one native pass (block_dequant.cpp; SmolLM2's Q4_1 file, one prompt's time to first token against torch's
# dequantization: 1.25-1.70x at 256-2,048 tokens; against the path before, the kernel to 511 rows and the float32
# GEMM from 512, 1.56-1.93x: benchmarks/results/prefill_ttft_smollm2.md). With
# that pass the GEMM also led the kernel at 64-128 rows with the weights in cache (1.15-1.66x a layer, 1 and 2
# threads, benchmarks/results/prefill_gemm_bf16.md; 1.65-2.30x from 256), but whole decode steps of the file at
# batch 40-64 were no faster (ad hoc, 4 alternated runs), so decode batches keep the kernel.
DEQUANT_ROWS = I8_DEQUANT_ROWS
Q8_DEQUANT_ROWS = 1 << 30 if bf16_gemm_is_emulated() else DEQUANT_ROWS


def _blocks(raw: torch.Tensor, type_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(code bytes [N, K / 32 * code bytes], fp16 d [N, K / 32], Q4_1's fp16 m or None) of ``raw``; Q4_K's
    float32 scale and offset per 32 values, its codes repacked in the kernels' nibble order."""
    if type_name == "Q4_K":
        codes, scales, offsets = q4_k_affine(raw)
        pairs = codes.view(codes.shape[0], -1, 2, BLOCK // 2)  # per 32 values: byte j holds j low, j + 16 high
        return (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(codes.shape[0], -1), scales, offsets
    n, row_bytes = raw.shape
    size = BLOCK_BYTES[type_name]
    blocks = raw.reshape(n, row_bytes // size, size)
    d = blocks[..., 0:2].contiguous().view(torch.float16).squeeze(-1)
    m = blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1) if type_name == "Q4_1" else None
    start = 4 if type_name == "Q4_1" else 2
    return blocks[..., start:].reshape(n, -1).contiguous(), d, m


def kernel_tensors(raw: torch.Tensor, type_name: str) -> dict[str, torch.Tensor]:
    """The native kernels' tensors straight from a GGUF block matrix ``raw`` uint8 [N, K / 32 * block bytes], equal
    to ``native.pack_int4_affine`` / ``pack_int8_grouped`` of the decoded blocks: GGUF's nibble order (byte j: value
    j low, j + 16 high) is the kernel's, so the codes are the blocks' bytes and only the fp16 scales widen (decoding
    to one code per byte and packing again took seconds per model)."""
    codes, d16, m16 = _blocks(raw, type_name)
    d = d16.float()
    if type_name == "Q8_0":
        return {"codes": codes.view(torch.int8), "scales": d}
    mins = m16.float() if m16 is not None else d * -8.0
    offset = 8 if type_name == "Q4_0" else 0  # Q4_0 dequantizes as d * (q - 8), as native.pack_int4_affine notes
    return {"codes": codes, "scales": d, "mins": mins, "q_offset": torch.tensor(offset, dtype=torch.int32)}


def i8_kernel_tensors(raw: torch.Tensor, type_name: str) -> dict[str, torch.Tensor]:
    """The int8-activation kernels' tensors from ``raw``: the blocks' codes and their own fp16 scales (and Q4_1's
    fp16 minimums); Q4_0 without mins (its calls pass q_offset 8), so a call streams the file's 18 / 20 / 34 bytes
    per 32 weights; Q4_K with float32 scales and offsets (24 bytes per 32)."""
    codes, d, m = _blocks(raw, type_name)
    t = {"codes": codes.view(torch.int8) if type_name == "Q8_0" else codes, "scales": d.contiguous()}
    if m is not None:
        t["mins"] = m.contiguous()
    return t


def prepare_blocks(raw: torch.Tensor, type_name: str, dtype: torch.dtype) -> Prepared:
    """The kernel for GGUF blocks ``raw`` computing in ``dtype``: native grouped int8 / affine int4 for bf16 on the
    CPU when built, else the exact values dequantized once."""
    from cinq.layers.quantization import native
    device = raw.device
    if device.type == "cpu" and dtype == torch.bfloat16 and native.affine_kernels_available():
        if int8_activations():  # GGUF's own fp16 scales: the file's bytes per weight, streamed as they are
            return Prepared(f"gguf_{type_name.lower()}_i8", i8_kernel_tensors(raw, type_name), BLOCK)
        kind = "gguf_int8" if type_name == "Q8_0" else "gguf_int4"
        return Prepared(kind, kernel_tensors(raw, type_name), BLOCK)
    codes = decode_blocks(raw, type_name)
    say_once(f"GGUF {codes.type_name} blocks: no native kernel for {dtype} on {device.type}; dequantized once "
             f"at load (same values, dense speed and memory)")
    return Prepared(DEQUANTIZED_AT_LOAD, {"weight": codes.dequantize().to(device=device, dtype=dtype)})


def dequantize_i8_int4(t: dict[str, torch.Tensor], kind: str) -> torch.Tensor:
    """W [N, K] float32 of a Q4_0 / Q4_1 layer's int8-activation tensors (``i8_kernel_tensors``), the values
    ``decode_blocks(raw).dequantize()`` gives: code * d + m (Q4_0: m = -8 d)."""
    q = int4_codes_float(t["codes"])  # GGUF's nibble order is the native kernels' (``kernel_tensors``)
    n = q.shape[0]
    w = q.view(n, -1, BLOCK)
    d = t["scales"].float().unsqueeze(-1)
    w.mul_(d).add_(t["mins"].float().unsqueeze(-1) if "mins" in t else d * -8.0)
    return q


def dequantize_i8_int8(t: dict[str, torch.Tensor]) -> torch.Tensor:
    """W [N, K] float32 of a Q8_0 layer's int8-activation tensors: code * d per 32-value block."""
    q = t["codes"].float()
    n = q.shape[0]
    q.view(n, -1, BLOCK).mul_(t["scales"].float().unsqueeze(-1))
    return q


def weight_rows(t: dict[str, torch.Tensor], kind: str) -> WeightRows:
    """``(n0, n1) -> W[n0:n1]`` of an int8-activation GGUF layer for ``dequant_linear``: bf16 from the native
    dequantization where the bf16 GEMM is native (``native.bf16_weight_rows``), else the exact float32 values."""
    bits = 8 if kind == "gguf_q8_0_i8" else 4
    native_rows = bf16_weight_rows(t, BLOCK, bits)
    if native_rows is not None:
        return native_rows
    if bits == 8:
        return lambda n0, n1: dequantize_i8_int8(rows_of(t, n0, n1))
    return lambda n0, n1: dequantize_i8_int4(rows_of(t, n0, n1), kind)


def gguf_mm(kind: str, t: dict[str, torch.Tensor], group: int, x: torch.Tensor) -> torch.Tensor:
    """y = x W^T for a prepared GGUF layer; x [..., K] -> [..., N] in x's dtype."""
    if kind == DEQUANTIZED_AT_LOAD:
        return weight_only_mm(kind, t, group, x)
    from cinq.layers.quantization import native
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    x2 = x2 if x2.dtype == torch.bfloat16 else x2.to(torch.bfloat16)
    if kind.endswith("_i8"):
        x2 = x2 if x2.is_contiguous() else x2.contiguous()
        if x2.shape[0] >= (Q8_DEQUANT_ROWS if kind == "gguf_q8_0_i8" else DEQUANT_ROWS):
            y = dequant_linear(x2, weight_rows(t, kind), t["codes"].shape[0])
        elif kind == "gguf_q8_0_i8":
            y = int8_grouped_linear_i8(x2, t, group)
        else:
            y = int4_affine_linear_i8(x2, t, group, 8 if kind == "gguf_q4_0_i8" else 0)
    else:
        y = (native.int8_grouped_linear if kind == "gguf_int8" else native.int4_affine_linear)(x2, t, group)
    return (y if y.dtype == x.dtype else y.to(x.dtype)).reshape(*lead, -1)


class GGUFLinear(QuantizedLinear):
    """A linear stored as one GGUF block type (``type_name`` in Q8_0, Q4_0, Q4_1, Q4_K), merged shards included."""

    def __init__(self, in_features: int, out_features: int, bias: bool, type_name: str, prefix: str = "", *,
                 compute_dtype: torch.dtype, output_shards: OutputShards | None = None,
                 split: LinearSplit | None = None) -> None:
        super().__init__(in_features, out_features, bias, prefix, compute_dtype, output_shards, split)
        if split is not None:
            raise InvalidParameterError(f"{prefix}: GGUF {type_name} weights are served natively with "
                                        f"tensor_parallel_size 1 only", "tensor_parallel_size")
        served = (*BLOCK_BYTES, *K_BLOCK_BYTES)
        if type_name not in served:
            raise InvalidParameterError(f"{prefix}: GGUF type {type_name!r} is not served natively "
                                        f"({', '.join(served)})", "type_name")
        if in_features % values_per_block(type_name):
            raise InvalidParameterError(f"{prefix}: in_features {in_features} is not a multiple of "
                                        f"{values_per_block(type_name)} ({type_name} blocks)", "in_features")
        self.type_name = type_name
        self._checkpoint_buffer("weight", (out_features, row_bytes(type_name, in_features)), torch.uint8, _ROWS)

    def process_weights_after_loading(self) -> None:
        prepared = prepare_blocks(self.weight, self.type_name, self.compute_dtype)
        self._install(prepared, ("weight",))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._add_bias(gguf_mm(self.kind, self._kernel_tensors(), self.group, x))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gguf={self.type_name}"
