"""A GGUF file's tensors as the checkpoint tensors cinq's loader hands to layers, and the linear factory that
decides, per projection, how each is served.

- F32 / F16 / BF16 tensors are read as they are (a view of the mapped file, converted by the layer's copy).
- Q8_0 / Q4_0 / Q4_1 matrices of the decoder's linears (and the LM head, also when it is the tied embedding)
  load as their raw blocks into ``GGUFLinear`` (no requantization). A merged projection (q/k/v, gate/up) is served
  natively when its shards share one of these types; shards of mixed types are dequantized into a dense linear.
- every other type (k-quants Q4_K, Q5_K, Q6_K ..., and the 32-value types no kernel takes: Q5_0, Q5_1) and every
  non-linear use (the embedding lookup, norms) is dequantized at load with the gguf package's reference code.
The ``llama`` architecture's q/k rows are permuted back to rotate-half order as they are read (names.py).
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from cinq.layers.linear_split import LinearSplit
from cinq.layers.quantization.gguf_blocks import NATIVE_TYPES
from cinq.layers.quantization.gguf_linear import GGUFLinear
from cinq.layers.weight_loader import CheckpointTensor, OutputShards
from cinq.model.gguf.file import GGML_TYPE_IDS, GGUFFile, GGUFTensorInfo
from cinq.model.gguf.names import ROPE_PERMUTED, hf_tensor_name, unpermute_rows

_FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# the checkpoint modules of each model linear, as GGUF names per layer (merged projections list their shards)
_LINEAR_GROUPS = {"qkv": ("attn_q", "attn_k", "attn_v"), "o": ("attn_output",), "gate_up": ("ffn_gate", "ffn_up"),
                  "down": ("ffn_down",)}


@dataclass(slots=True)
class GGUFFormat:
    """The ``LinearFactory`` of a GGUF file: which checkpoint modules are served from their own blocks (and as which
    type), and the load line's account of every tensor type. ``native``: HF module prefix -> GGUF type."""

    gguf: GGUFFile
    head_from_embedding: bool
    native: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, gguf: GGUFFile, num_layers: int, tied: bool) -> GGUFFormat:
        t = gguf.tensors
        head = "token_embd.weight" if tied else "output.weight"
        fmt = cls(gguf, tied and t[head].type_name in NATIVE_TYPES)
        for i in range(num_layers):
            for parts in _LINEAR_GROUPS.values():
                infos = [t.get(f"blk.{i}.{p}.weight") for p in parts]
                kinds = {info.type_name for info in infos if info is not None}
                if len(kinds) == 1 and (kind := kinds.pop()) in NATIVE_TYPES:
                    for p in parts:
                        fmt.native[hf_tensor_name(f"blk.{i}.{p}.weight").rsplit(".", 1)[0]] = kind
        if head in t and t[head].type_name in NATIVE_TYPES:
            fmt.native["lm_head"] = t[head].type_name
        return fmt

    def quantizes(self, prefix: str) -> bool:
        return prefix in self.native

    def make_linear(self, in_features: int, out_features: int, bias: bool, prefix: str, compute_dtype: torch.dtype,
                    output_shards: OutputShards | None = None, split: LinearSplit | None = None) -> nn.Module:
        key = prefix if output_shards is None else _first_shard(prefix, output_shards)
        return GGUFLinear(in_features, out_features, bias, self.native[key], prefix, compute_dtype=compute_dtype,
                          output_shards=output_shards, split=split)

    def summary(self) -> str:
        """What the file holds and what cinq does with each tensor type, for the load line."""
        counts = Counter((info.type_name, self._how(info)) for info in self.gguf.tensors.values())
        parts = [f"{n} {kind} {how}" for (kind, how), n in sorted(counts.items(), key=lambda kv: -kv[1])]
        if self.head_from_embedding:
            parts.append(f"the LM head served from the tied embedding's {self.native['lm_head']} blocks")
        ftype = self.gguf.get("general.file_type")
        return f"GGUF v{self.gguf.version}{f' (file type {ftype})' if ftype is not None else ''}: " + ", ".join(parts)

    def _how(self, info: GGUFTensorInfo) -> str:
        if info.type_name in _FLOAT_DTYPES:
            return "as is"
        name = hf_tensor_name(info.name)
        if name is not None and name.rsplit(".", 1)[0] in self.native:
            return "served natively"
        return "dequantized at load"


def _first_shard(prefix: str, shards: OutputShards) -> str:
    from cinq.model.llama import STACKED_PARAMS_MAPPING
    for merged, part, shard_id in STACKED_PARAMS_MAPPING:
        if prefix.endswith(merged) and shard_id == shards.ids[0]:
            return prefix[: -len(merged)] + part
    return prefix


def _view(array: np.ndarray) -> torch.Tensor:
    """A tensor over the read-only mapped file, without a copy: the layers copy what they keep (torch warns about
    a read-only buffer, and nothing here writes to it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def dequantize_info(gguf: GGUFFile, info: GGUFTensorInfo) -> torch.Tensor:
    """The tensor's values (float types as stored, every other type float32 via the gguf package's reference)."""
    raw = gguf.tensor_bytes(info)
    if info.type_name in _FLOAT_DTYPES:
        return _view(raw).view(_FLOAT_DTYPES[info.type_name]).reshape(info.shape)
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize
    rows = raw.reshape(-1, info.row_bytes)
    values = dequantize(rows, GGMLQuantizationType(GGML_TYPE_IDS[info.type_name]))
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(info.shape)


def raw_blocks(gguf: GGUFFile, info: GGUFTensorInfo) -> torch.Tensor:
    """The tensor's blocks as uint8 [rows, row bytes] (a view of the mapping)."""
    return _view(gguf.tensor_bytes(info).reshape(-1, info.row_bytes))


def iter_gguf_checkpoint(gguf: GGUFFile, fmt: GGUFFormat | None, heads: dict[str, int]) -> Iterator[CheckpointTensor]:
    """Every tensor as a Hugging Face-named checkpoint tensor, unread until ``load()``: raw blocks where ``fmt``
    serves the module natively, values otherwise. ``heads``: q/k head counts for undoing the llama rope order."""
    permute = gguf.architecture in ROPE_PERMUTED
    for info in gguf.tensors.values():
        name = hf_tensor_name(info.name)
        if name is None:
            from cinq.errors import ModelLoadError
            raise ModelLoadError(f"{gguf.path}: tensor '{info.name}' has no place in a "
                                 f"{gguf.architecture} model (unexpected tensor)")
        module = name.rsplit(".", 1)[0]
        role = info.name.split(".")[-2]
        rows = unpermute_rows(info.shape[0], heads[role]) if permute and role in heads else None
        native = fmt is not None and name.endswith(".weight") and module in fmt.native
        yield _tensor(gguf, info, name, native, rows)
        if name == "model.embed_tokens.weight" and fmt is not None and fmt.head_from_embedding:
            yield _tensor(gguf, info, "lm_head.weight", True, None)


def _tensor(gguf: GGUFFile, info: GGUFTensorInfo, name: str, native: bool, rows: torch.Tensor | None
            ) -> CheckpointTensor:
    shape = (info.shape[0], info.row_bytes) if native else info.shape

    def read(index: tuple[slice, ...] | None) -> torch.Tensor:
        t = raw_blocks(gguf, info) if native else dequantize_info(gguf, info)
        if rows is not None:
            t = t[rows]
        return t if index is None else t[index]

    return CheckpointTensor(name, shape, read)
