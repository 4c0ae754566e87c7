"""Linear layers. The model asks ``make_linear`` for each projection; what it gets back (dense, or a quantized
kind chosen from the checkpoint's ``quantization_config``) is invisible to the model code.

Contract for every linear kind: it loads its checkpoint tensors itself through
``weight_loader(param_name, tensor, shard_id)`` (cinq/layers/weight_loader.py), whole or one output shard at a
time for merged projections (QKV, gate/up: one GEMM instead of three or two); an optional
``process_weights_after_loading()`` then repacks them for the kernel.

Kinds: ``DenseLinear`` here; the quantized ones (GPTQ, AWQ, W8A8) live in cinq/layers/quantization/.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from cinq.distributed.parallel_state import all_reduce_output_hook
from cinq.kernels.cpu_native import chunked_small_m_linear, small_m_linear_native
from cinq.kernels.prefill_gemm import dense_fp32_linear
from cinq.layers.linear_base import LinearBase
from cinq.layers.linear_split import ROW, LinearSplit
from cinq.layers.weight_loader import CheckpointTensor, OutputShards, ParamLayout, ShardId, load_sharded

_DENSE_LAYOUT = ParamLayout(output_dim=0, input_dim=1)  # weight [out, in]; a bias has no input dimension
_BIAS_LAYOUT = ParamLayout(output_dim=0)


class LinearFactory(Protocol):
    """What a quantization format provides to build its linear layers."""

    def quantizes(self, prefix: str) -> bool:
        """True when the checkpoint module ``prefix`` is stored quantized (else it stays dense)."""
        ...

    def make_linear(self, in_features: int, out_features: int, bias: bool, prefix: str, compute_dtype: torch.dtype,
                    output_shards: OutputShards | None = None, split: LinearSplit | None = None) -> nn.Module:
        """The quantized linear named ``prefix`` (merged from ``output_shards`` when given; ``split``: this
        tensor-parallel rank's part, sizes being the rank's)."""
        ...


class DenseLinear(LinearBase):
    """y = x W^T + b with W [out_features, in_features] in the model dtype. Decode-sized bf16 inputs on the CPU
    (at most ``small_m_rows()`` rows: 32 where the kernel beats oneDNN, no autograd) go through the native skinny
    kernel when it is available: a few sequences' decode, or a speculative verify of up to 31 drafts. On CPUs without
    bf16 instructions (AVX2), inputs of ``prefill_gemm.DENSE_MIN_ROWS`` rows or more (prefill) run BLAS's float32
    GEMM on the weight widened a block at a time, and those in between (batched decode) the skinny kernel in
    chunks of rows.

    With ``output_shards`` it is a merged projection: W's rows are the shards' rows in order, each loaded from
    its own checkpoint tensor. With ``split`` (tensor parallelism) the sizes are this rank's, and each checkpoint
    tensor is narrowed to the rank's slice before it is read."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 output_shards: OutputShards | None = None, prefix: str = "",
                 split: LinearSplit | None = None) -> None:
        super().__init__(in_features, out_features, prefix, output_shards, split)
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def param_layout(self, name: str) -> ParamLayout:
        """Weight and bias both carry the output channels along dim 0 (the weight its inputs along dim 1)."""
        return _BIAS_LAYOUT if name == "bias" else _DENSE_LAYOUT

    def weight_loader(self, name: str, loaded: CheckpointTensor, shard_id: ShardId | None = None) -> None:
        """Fill ``weight`` or ``bias`` from a checkpoint tensor (one shard's rows when merged)."""
        layout = self.param_layout(name)
        dst = getattr(self, name)
        load_sharded(dst, self.rank_part(loaded, layout, shard_id), layout, self.output_shards, shard_id, self.prefix)
        if self.drops_bias(name):
            with torch.no_grad():
                dst.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.bfloat16 and x.device.type == "cpu" and not torch.is_grad_enabled():
            y = small_m_linear_native(x, self.weight, self.bias)
            if y is None:  # prefill-sized, on CPUs without bf16 instructions: widen + float32 GEMM
                y = dense_fp32_linear(x, self.weight, self.bias)
            if y is None:  # more rows than decode, fewer than prefill: the native kernel in chunks still wins
                y = chunked_small_m_linear(x, self.weight, self.bias)
            if y is not None:
                return y
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        shards = "" if self.output_shards is None else f", shards={self.output_shards.ids}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
                f"{shards}")


def make_linear(in_features: int, out_features: int, bias: bool, quant: LinearFactory | None = None,
                prefix: str = "", compute_dtype: torch.dtype | None = None,
                output_shards: OutputShards | None = None, quant_prefix: str | None = None,
                split: LinearSplit | None = None) -> nn.Module:
    """A dense linear, or the quantized kind ``quant`` builds for this layer.

    ``compute_dtype``: the dtype quantized kernels compute in (default: torch's default dtype, the one dense
    parameters are created in). ``output_shards``: a merged projection (see ``can_merge``). ``quant_prefix``: the
    checkpoint module whose entry in the quantization config decides the kind (default ``prefix``; for a merged
    linear, its first shard's name). ``split``: this rank's tensor-parallel part (sizes are then the rank's); a
    row-parallel one gets the all-reduce of its partial sums as a forward hook (None: no hook, no extra op)."""
    if quant is not None and quant.quantizes(prefix if quant_prefix is None else quant_prefix):
        dtype = torch.get_default_dtype() if compute_dtype is None else compute_dtype
        if split is None:  # factories written before tensor parallelism take no split
            layer = quant.make_linear(in_features, out_features, bias, prefix, dtype, output_shards)
        else:
            layer = quant.make_linear(in_features, out_features, bias, prefix, dtype, output_shards, split=split)
    else:
        layer = DenseLinear(in_features, out_features, bias, output_shards, prefix, split)
    if split is not None and split.parallel == ROW:
        layer.register_forward_hook(all_reduce_output_hook)
    return layer


def can_merge(quant: LinearFactory | None, prefixes: list[str]) -> bool:
    """True when the checkpoint linears ``prefixes`` (sharing one input) can load as one merged linear: always
    when dense; when quantized, if they are all of one kind (a format may keep some modules dense)."""
    return quant is None or len({quant.quantizes(p) for p in prefixes}) == 1
