"""``CollectedLinear``: a quantized linear that keeps each (shard's) checkpoint tensor as read and decodes them all
together after loading, for formats whose tensors only make sense together (NF4's packed bytes with their quant
state, whose block size and double quantization are known once the state's JSON is read; FP8's per-tensor scales,
one per merged shard).

Its checkpoint buffers are empty placeholders that name the tensors the loader must find (their checkpoint names
may hold dots: ``checkpoint_params`` maps a buffer name to its name after the module's, e.g. ``weight.absmax``).
Tensor parallelism is refused (these formats serve on one device).
"""

from __future__ import annotations

import torch

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.layers.linear_split import LinearSplit
from cinq.layers.quantization.linear import QuantizedLinear
from cinq.layers.weight_loader import CheckpointTensor, OutputShards, ParamLayout, ShardId

_ANY = ParamLayout(output_dim=0)


class CollectedLinear(QuantizedLinear):
    """Shared plumbing of the float-code linears (NF4Linear, FP8Linear)."""

    checkpoint_params: dict[str, str] = {}  # buffer name -> checkpoint name after "<module>." (when they differ)
    format_name = "float-code"

    def __init__(self, in_features: int, out_features: int, bias: bool, prefix: str, compute_dtype: torch.dtype,
                 output_shards: OutputShards | None, split: LinearSplit | None, names: tuple[str, ...]) -> None:
        super().__init__(in_features, out_features, bias, prefix, compute_dtype, output_shards, split)
        if split is not None:
            raise InvalidParameterError(f"{prefix}: {self.format_name} weights are served with tensor_parallel_size "
                                        f"1 only", "tensor_parallel_size")
        for name in names:
            self._checkpoint_buffer(name, (0,), torch.uint8, _ANY)
        self._raw: dict[tuple[ShardId | None, str], torch.Tensor] = {}

    def weight_loader(self, name: str, loaded: CheckpointTensor, shard_id: ShardId | None = None) -> None:
        if name == "bias":
            super().weight_loader(name, loaded, shard_id)
            return
        if self.output_shards is not None:
            self.output_shards.span(shard_id, self.prefix)  # an unknown shard id is named here
        self._raw[(shard_id, name)] = loaded.load()

    def shard_parts(self) -> list[tuple[str, int, dict[str, torch.Tensor]]]:
        """(name, output channels, tensors by buffer name) of each shard in output order (one part unmerged)."""
        ids = (None,) if self.output_shards is None else self.output_shards.ids
        sizes = (self.out_features,) if self.output_shards is None else self.output_shards.sizes
        parts = []
        for sid, size in zip(ids, sizes):
            where = self.prefix if sid is None else f"{self.prefix}[{sid}]"
            t = {name: v for (s, name), v in self._raw.items() if s == sid}
            parts.append((where, size, t))
        return parts

    def _finish(self, tensors: dict[str, torch.Tensor], kind: str, arg: int = 0) -> None:
        from cinq.layers.quantization.kernels import Prepared
        self._raw.clear()
        names = tuple(n for n in self._layouts if n != "bias" and n in self._buffers)
        self._install(Prepared(kind, tensors, arg), names)


def check_size(where: str, what: str, t: torch.Tensor, numel: int) -> None:
    if t.numel() != numel:
        raise ModelLoadError(f"checkpoint tensor '{where}.{what}': {t.numel()} values, the model needs {numel}")
