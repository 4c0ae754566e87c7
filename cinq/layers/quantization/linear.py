"""Quantized linear layers: ``GPTQLinear`` (GPTQ v1/v2 files, 2/3/4/8-bit weight-only: RTN and GPTQ write these),
``AWQLinear`` (AWQ GEMM files) and ``W8A8Linear`` (SmoothQuant).

Each holds its checkpoint tensors as buffers with the format's names and shapes, fills them through
``weight_loader`` (whole, or one output shard of a merged QKV / gate-up projection at a time), then
``process_weights_after_loading`` unpacks them once, hands them to the kernel chosen for the device and shape
(kernels.py), and keeps only the kernel's tensors.

Merging is exact for all three: the packed tensors are laid out per output channel, so shards concatenate along
the output dimension (whole int32 words: every shard's width is a multiple of the channels per word). What is
not per output channel is kept per shard or reconciled: GPTQ's g_idx, one for all shards when they agree and,
where act-order files give the shards different ones, one kernel per run of agreeing shards (shard_kernels.py
says why); W8A8's static input scale, see ``W8A8Linear``.

Tensor parallelism (``split``, cinq/layers/linear_split.py) narrows each checkpoint tensor to the rank's part
before reading it: output channels for a column split (each shard's g_idx whole), input channels for a row split
(packed rows of qweight, g_idx; AWQ's group rows; GPTQ keeps every group, act-order scattering channels over
them, and drops the unused ones after loading).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.layers.quantization.kernels import Prepared, prepare_weight_only, w8a8_mm, weight_only_mm
from cinq.layers.quantization.packing import awq_shapes, awq_unpack, gptq_shapes, gptq_unpack, pack_unit
from cinq.layers.linear_base import LinearBase
from cinq.layers.linear_split import ROW, LinearSplit
from cinq.layers.quantization.qweight import QuantizedWeight
from cinq.layers.quantization.shard_kernels import SHARD_KERNELS, ShardKernels, g_idx_runs
from cinq.layers.weight_loader import (CheckpointTensor, OutputShards, ParamLayout, ShardId, check_and_copy,
                                       load_sharded)

_PER_ROW = ParamLayout(output_dim=0)
_SHARED = ParamLayout(output_dim=None)
_PER_INPUT = ParamLayout(output_dim=None, input_dim=0)  # GPTQ's g_idx: one entry per input channel
_SHAPE_HINT = " (check quantization_config's bits and group_size against the tensors)"


class QuantizedLinear(LinearBase):
    """Shared plumbing: checkpoint tensors as buffers, replaced after loading by the kernel's own tensors.

    ``compute_dtype`` is the dtype the kernels compute (and return) in: the model's dtype. ``split``: this
    tensor-parallel rank's part (sizes are the rank's; each checkpoint tensor is narrowed to it before reading)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, prefix: str, compute_dtype: torch.dtype,
                 output_shards: OutputShards | None = None, split: LinearSplit | None = None) -> None:
        super().__init__(in_features, out_features, prefix, output_shards, split)
        self.compute_dtype = compute_dtype
        self.kind = "unloaded"
        self.group = 0
        self._layouts: dict[str, ParamLayout] = {"bias": _PER_ROW}
        self._shared_loaded: set[str] = set()  # shared tensors (no output dim) already filled by a shard
        if bias:
            self.register_buffer("bias", torch.empty(out_features, dtype=compute_dtype))
        else:
            self.bias = None

    def _checkpoint_buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, layout: ParamLayout) -> None:
        self.register_buffer(name, torch.empty(shape, dtype=dtype))
        self._layouts[name] = layout

    def param_layout(self, name: str) -> ParamLayout:
        """Where checkpoint tensor ``name``'s output channels lie (for loading and splitting shards)."""
        return self._layouts[name]

    def weight_loader(self, name: str, loaded: CheckpointTensor, shard_id: ShardId | None = None) -> None:
        """Fill checkpoint buffer ``name`` (one shard's part of it when merged)."""
        layout = self._layouts[name]
        loaded = self.rank_part(loaded, layout, shard_id)
        if layout.output_dim is None and shard_id is not None:
            self._load_shared(name, loaded, shard_id)
            return
        load_sharded(getattr(self, name), loaded, layout, self.output_shards, shard_id, self.prefix, _SHAPE_HINT)
        if self.drops_bias(name):
            self.bias.zero_()

    def _load_shared(self, name: str, loaded: CheckpointTensor, shard_id: ShardId) -> None:
        """A tensor every shard carries whole and must agree on (the first one loaded is kept)."""
        dst = getattr(self, name)
        if name not in self._shared_loaded:
            load_sharded(dst, loaded, _SHARED, None, None, self.prefix, _SHAPE_HINT)
            self._shared_loaded.add(name)
            return
        t = loaded.load()
        if tuple(t.shape) != tuple(dst.shape) or not torch.equal(t.to(dst.device, dst.dtype), dst):
            raise ModelLoadError(f"checkpoint tensor '{loaded.name}' differs from the other shards' '{name}' of the "
                                 f"merged {self.prefix} (shard {shard_id!r}); cinq merges these projections and "
                                 f"needs one {name} for all of them")

    def _install(self, prepared: Any, drop: tuple[str, ...]) -> None:
        for name in drop:
            delattr(self, name)
        for name, t in prepared.tensors.items():
            self.register_buffer(name, t, persistent=False)
        self.kind = prepared.kind
        self.group = prepared.arg
        self._shared_loaded.clear()

    def _kernel_tensors(self) -> dict[str, torch.Tensor]:
        """The kernel's tensors by name: the module's buffer dict itself (no copy on the hot path)."""
        if self.kind == "unloaded":
            raise RuntimeError(f"{self.prefix or type(self).__name__}: process_weights_after_loading() has not run")
        return self._buffers

    def _add_bias(self, y: torch.Tensor) -> torch.Tensor:
        b = self.bias
        return y if b is None else y + (b if b.dtype == y.dtype else b.to(y.dtype))

    def _check_shard_packing(self, bits: int, what: str) -> None:
        """Every shard must fill whole words along the packed output dimension."""
        sizes = self.output_shards.sizes if self.output_shards is not None else (self.out_features,)
        for size in sizes:
            _packed_dims(self.prefix, what, size, bits)

    def extra_repr(self) -> str:
        shards = "" if self.output_shards is None else f", shards={self.output_shards.ids}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"kernel={self.kind}{shards}")


def _packed_dims(prefix: str, what: str, size: int, bits: int) -> int:
    """int32 words that ``size`` values of ``bits`` bits pack into (whole packing units only)."""
    values, words = pack_unit(bits)
    if size % values:
        raise ModelLoadError(f"{prefix}: {what} {size} is not a multiple of {values}, so {bits}-bit weights cannot be "
                             f"packed into int32 words")
    return size // values * words


class GPTQLinear(QuantizedLinear):
    """A linear stored as GPTQ v1/v2 tensors (qweight, qzeros, scales, g_idx); 2, 3, 4 or 8 bits (2 and 3 are
    served dequantized at load: kernels.DEQUANTIZED_AT_LOAD).

    Merged from shards, its ``g_idx`` buffer holds the first loaded shard's; a shard whose g_idx differs keeps
    its own until loading ends (so the common case allocates exactly what an unmerged layer does). Shards that
    agree (no act-order, or one act-order permutation for all) load as one weight and one kernel; shards that
    differ (AutoGPTQ / GPTQModel quantizing each projection with its own Hessian order) are served as one kernel
    per run of agreeing shards, concatenated along N (kind ``shard_kernels``; see shard_kernels.py)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, bits: int, group_size: int,
                 version: int = 1, prefix: str = "", *, compute_dtype: torch.dtype,
                 output_shards: OutputShards | None = None, split: LinearSplit | None = None) -> None:
        super().__init__(in_features, out_features, bias, prefix, compute_dtype, output_shards, split)
        self.bits, self.group_size, self.version = bits, group_size, version
        _packed_dims(prefix, "in_features", in_features, bits)
        self._check_shard_packing(bits, "out_features")
        shapes = gptq_shapes(in_features, out_features, bits, group_size)
        values, words = pack_unit(bits)
        if split is not None and words != 1:
            raise InvalidParameterError(f"{prefix}: {bits}-bit GPTQ weights pack across word boundaries and cannot be "
                                        f"split for tensor_parallel_size {split.size}; serve them with 1",
                                        "tensor_parallel_size")
        if split is not None and split.parallel == ROW:
            # A row shard keeps every group's scales / zeros (act-order scatters its channels over all of them);
            # the groups it does not use are dropped after loading (QuantizedWeight.groups_in_use).
            whole = gptq_shapes(split.in_size * split.size, out_features, bits, group_size)
            shapes["qzeros"], shapes["scales"] = whole["qzeros"], whole["scales"]
        # qweight packs along K: its columns are output channels one to one; qzeros packs along N. (3 bits:
        # 32 channels per 3 words, which ParamLayout's whole channels-per-word cannot say: see weight_loader.)
        self._checkpoint_buffer("qweight", shapes["qweight"], torch.int32,
                                ParamLayout(1, input_dim=0, input_pack=values))
        self._checkpoint_buffer("qzeros", shapes["qzeros"], torch.int32, ParamLayout(1, values if words == 1 else 1))
        self._checkpoint_buffer("scales", shapes["scales"], torch.float16, ParamLayout(1))
        self._checkpoint_buffer("g_idx", shapes["g_idx"], torch.int32, _PER_INPUT)
        self._shard_g_idx: dict[ShardId, torch.Tensor] = {}  # shards whose g_idx differs from the buffer's
        self.shard_kernels: ShardKernels | None = None  # set when merged shards need different g_idx

    def weight_loader(self, name: str, loaded: CheckpointTensor, shard_id: ShardId | None = None) -> None:
        """As the base class; one shard's g_idx is kept when it differs from the first loaded one's, one shard's
        3-bit qzeros fill words [start * 3 / 32, (start + size) * 3 / 32)."""
        if name == "g_idx" and shard_id is not None and self.output_shards is not None:
            self._load_shard_g_idx(loaded, shard_id)
            return
        values, words = pack_unit(self.bits)
        if name != "qzeros" or words == 1 or shard_id is None or self.output_shards is None:
            super().weight_loader(name, loaded, shard_id)
            return
        start, size = self.output_shards.span(shard_id, self.prefix)
        if start % values or size % values:  # the constructor checked the sizes, hence the starts
            raise ModelLoadError(f"checkpoint tensor '{loaded.name}': shard {shard_id!r} of {self.prefix} ({size} "
                                 f"channels at {start}) does not fill whole {self.bits}-bit packing units")
        rows = self.qzeros.narrow(1, start // values * words, size // values * words)
        check_and_copy(rows, loaded, f"shard {shard_id!r} of the model's", _SHAPE_HINT)

    def _load_shard_g_idx(self, loaded: CheckpointTensor, shard_id: ShardId) -> None:
        """The first shard's g_idx fills the buffer; a later one is kept aside only when it differs from it."""
        self.output_shards.span(shard_id, self.prefix)  # an unknown shard id is named here
        if self.split is not None:  # column: whole; row: the rank's input channels
            loaded = self.split.narrow(loaded, _PER_INPUT, shard_id, self.output_shards, self.out_features,
                                       self.prefix)
        what = f"shard {shard_id!r} of the model's"
        if "g_idx" not in self._shared_loaded:
            check_and_copy(self.g_idx, loaded, what, _SHAPE_HINT)
            self._shared_loaded.add("g_idx")
            return
        own = torch.empty_like(self.g_idx)
        check_and_copy(own, loaded, what, _SHAPE_HINT)
        if not torch.equal(own, self.g_idx):
            self._shard_g_idx[shard_id] = own

    def quantized_weights(self) -> list[QuantizedWeight]:
        """The checkpoint tensors unpacked (before ``process_weights_after_loading``): one weight per run of
        adjacent shards sharing a g_idx, in output order; a single weight when unmerged or all shards agree."""
        if self.output_shards is None:
            return [self._unpack(slice(None), self.g_idx, self.prefix)]
        ids, sizes = self.output_shards.ids, self.output_shards.sizes
        rows = [self._shard_g_idx.get(s, self.g_idx) for s in ids]
        runs = g_idx_runs(rows)
        if len(runs) == 1:  # the common case: exactly the unmerged layer's path
            return [self._unpack(slice(None), self.g_idx, self.prefix)]
        out = []
        for first, stop in runs:
            lo = sum(sizes[:first])
            names = "+".join(str(s) for s in ids[first:stop])
            out.append(self._unpack(slice(lo, lo + sum(sizes[first:stop])), rows[first], f"{self.prefix}[{names}]"))
        return out

    def quantized_weight(self) -> QuantizedWeight:
        """The checkpoint tensors unpacked as one weight; a merged layer whose shards carry different g_idx has
        none (see ``quantized_weights``)."""
        parts = self.quantized_weights()
        if len(parts) != 1:
            raise ModelLoadError(f"{self.prefix}: its shards' g_idx differ ({len(parts)} runs of agreeing shards); "
                                 f"unpack them with quantized_weights()")
        return parts[0]

    def _unpack(self, cols: slice, g_idx: torch.Tensor, name: str) -> QuantizedWeight:
        """Output channels ``cols`` (whole packing units: the constructor checked every shard's width) with
        ``g_idx``."""
        values, words = pack_unit(self.bits)
        zero_cols = cols if cols.start is None else slice(cols.start // values * words, cols.stop // values * words)
        t = {"qweight": self.qweight[:, cols], "qzeros": self.qzeros[:, zero_cols], "scales": self.scales[:, cols],
             "g_idx": g_idx}
        qw = gptq_unpack(t, self.bits, self.group_size, self.version, name=name)
        return qw.groups_in_use() if self.split is not None and self.split.parallel == ROW else qw

    def process_weights_after_loading(self) -> None:
        device = self.qweight.device
        parts = [prepare_weight_only(qw, device, self.compute_dtype, self.prefix) for qw in self.quantized_weights()]
        self._shard_g_idx.clear()
        drop = ("qweight", "qzeros", "scales", "g_idx")
        self._install(parts[0] if len(parts) == 1 else Prepared(SHARD_KERNELS), drop)
        if len(parts) > 1:
            self.shard_kernels = ShardKernels(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = self.shard_kernels  # None (a plain attribute) unless the shards need different g_idx
        if parts is not None:
            return self._add_bias(parts(x))
        return self._add_bias(weight_only_mm(self.kind, self._kernel_tensors(), self.group, x))


class AWQLinear(QuantizedLinear):
    """A linear stored as AWQ GEMM tensors (qweight, qzeros, scales); 4 bits."""

    def __init__(self, in_features: int, out_features: int, bias: bool, group_size: int, prefix: str = "", *,
                 compute_dtype: torch.dtype, output_shards: OutputShards | None = None,
                 split: LinearSplit | None = None) -> None:
        super().__init__(in_features, out_features, bias, prefix, compute_dtype, output_shards, split)
        self.bits, self.group_size = 4, group_size
        self._check_shard_packing(4, "out_features")
        g = in_features if group_size <= 0 else group_size
        if in_features % g:
            raise ModelLoadError(f"{prefix}: in_features {in_features} is not a multiple of group_size {g} (AWQ)")
        shapes = awq_shapes(in_features, out_features, group_size)
        # a row shard takes its input channels' groups (per channel, group_size <= 0: the one group whole)
        per_group = {"input_dim": 0, "input_pack": group_size} if group_size > 0 else {}
        self._checkpoint_buffer("qweight", shapes["qweight"], torch.int32, ParamLayout(1, 8, input_dim=0))
        self._checkpoint_buffer("qzeros", shapes["qzeros"], torch.int32, ParamLayout(1, 8, **per_group))
        self._checkpoint_buffer("scales", shapes["scales"], torch.float16, ParamLayout(1, **per_group))

    def quantized_weight(self) -> QuantizedWeight:
        t = {"qweight": self.qweight, "qzeros": self.qzeros, "scales": self.scales}
        return awq_unpack(t, self.group_size, name=self.prefix)

    def process_weights_after_loading(self) -> None:
        qw = self.quantized_weight()
        prepared = prepare_weight_only(qw, self.qweight.device, self.compute_dtype, self.prefix)
        self._install(prepared, ("qweight", "qzeros", "scales"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._add_bias(weight_only_mm(self.kind, self._kernel_tensors(), self.group, x))


class W8A8Linear(QuantizedLinear):
    """int8 weights (per channel) x int8 activations (per token, or per tensor when ``static``): SmoothQuant.

    Merged shards share one input, so one static input scale: cinq's SmoothQuant writes the same scale for the
    linears of a shared input. Files whose shards disagree load with the largest one, which no shard's
    activations then clip under (a smaller one would clip the others'; finer resolution is what is given up).

    Under tensor parallelism a row-parallel rank quantizes its own slice of each token's activations: with dynamic
    scales that is a finer grid than one device's (each slice its own scale), so outputs differ slightly from
    tensor_parallel_size 1; static scales are the same on every rank."""

    def __init__(self, in_features: int, out_features: int, bias: bool, static: bool = False,
                 prefix: str = "", *, compute_dtype: torch.dtype, output_shards: OutputShards | None = None,
                 split: LinearSplit | None = None) -> None:
        super().__init__(in_features, out_features, bias, prefix, compute_dtype, output_shards, split)
        self.static = static
        self._checkpoint_buffer("weight", (out_features, in_features), torch.int8, ParamLayout(0, input_dim=1))
        self._checkpoint_buffer("weight_scale", (out_features,), torch.float32, _PER_ROW)
        if static:
            self._checkpoint_buffer("input_scale", (1,), torch.float32, _SHARED)
        else:
            self.input_scale = None

    def _load_shared(self, name: str, loaded: CheckpointTensor, shard_id: ShardId) -> None:
        if name != "input_scale" or name not in self._shared_loaded:
            super()._load_shared(name, loaded, shard_id)
            return
        t = loaded.load()
        if tuple(t.shape) != tuple(self.input_scale.shape):
            raise ModelLoadError(f"checkpoint tensor '{loaded.name}': shape {tuple(t.shape)} does not match the "
                                 f"model's {tuple(self.input_scale.shape)}")
        with torch.no_grad():
            torch.maximum(self.input_scale, t.to(self.input_scale.dtype), out=self.input_scale)

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


def dequantize_weight_only(model: nn.Module) -> int:
    """Serve every weight-only quantized layer of ``model`` (GPTQ / RTN / AWQ) from the dense weight its kernel
    computes with, read back through the kernel itself (y = I W^T), so the function stays the quantized model's.
    For forwards over many rows at once, as when a frozen quantized target teaches a draft head: the CPU int4 /
    int8 kernels are built for decode-sized batches and run a float32 training forward 25-100x slower than a
    dense matmul. W8A8 layers are kept (their output also depends on the activations' quantization). Returns the
    number of layers converted."""
    from cinq.layers.quantization.kernels import DEQUANTIZED_AT_LOAD
    n = 0
    for m in list(model.modules()):
        if not isinstance(m, (GPTQLinear, AWQLinear)) or m.kind in ("unloaded", DEQUANTIZED_AT_LOAD):
            continue
        if m.kind == SHARD_KERNELS:  # one dense weight for all the runs
            with torch.no_grad():
                w = m.shard_kernels.dense_weight(m.in_features, m.compute_dtype)
            del m.shard_kernels
            m.shard_kernels = None
            m._install(Prepared(DEQUANTIZED_AT_LOAD, {"weight": w}), ())
            n += 1
            continue
        t = m._kernel_tensors()
        device = next(iter(t.values())).device
        with torch.no_grad():
            eye = torch.eye(m.in_features, dtype=m.compute_dtype, device=device)
            w = weight_only_mm(m.kind, t, m.group, eye).t().contiguous()
        m._install(Prepared(DEQUANTIZED_AT_LOAD, {"weight": w}), tuple(k for k in t if k != "bias"))
        n += 1
    return n
