"""A GGUF file's tensors as the checkpoint tensors cinq's loader hands to layers (plan.py decides, per
projection, how each is served).

- F32 / F16 / BF16 tensors are read as they are (a view of the mapped file, converted by the layer's copy).
- Q8_0 / Q4_0 / Q4_1 matrices of the decoder's linears (and the LM head, also when it is the tied embedding)
  load as their raw blocks into ``GGUFLinear`` (no requantization). A merged projection (q/k/v, gate/up) is served
  natively when its shards share one of these types; shards of mixed types are dequantized into a dense linear.
- Q4_K matrices load as their raw blocks too; Q5_0 ones are rewritten as Q8_0 blocks of the same values
  (gguf_blocks.q5_0_as_q8_0).
- every other type (k-quants Q5_K, Q6_K ..., and Q5_1) and every non-linear use (the embedding lookup, norms) is
  dequantized at load with the gguf package's reference code.
The ``llama`` architecture's q/k rows are permuted back to rotate-half order as they are read (names.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import numpy as np
import torch

from cinq.layers.quantization.gguf_blocks import q5_0_as_q8_0, row_bytes, served_type
from cinq.layers.weight_loader import CheckpointTensor
from cinq.model.gguf.file import GGML_TYPE_IDS, GGUFFile, GGUFTensorInfo
from cinq.model.gguf.names import NORM_PLUS_ONE, ROPE_PERMUTED, hf_tensor_name, unpermute_rows
from cinq.model.gguf.plan import FLOAT_DTYPES, GGUFFormat

_FLOAT_DTYPES = {name: getattr(torch, dtype) for name, dtype in FLOAT_DTYPES.items()}


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


def iter_gguf_checkpoint(gguf: GGUFFile, fmt: GGUFFormat | None, heads: dict[str, int]
                         ) -> Iterator[CheckpointTensor]:
    """Every tensor as a Hugging Face-named checkpoint tensor, unread until ``load()``: raw blocks where ``fmt``
    serves the module natively, values otherwise. ``heads``: q/k head counts for undoing the llama rope order."""
    permute = gguf.architecture in ROPE_PERMUTED
    minus_one = gguf.architecture in NORM_PLUS_ONE
    for info in gguf.tensors.values():
        name = hf_tensor_name(info.name, gguf.architecture)
        if name is None:
            from cinq.errors import ModelLoadError
            raise ModelLoadError(f"{gguf.path}: tensor '{info.name}' has no place in a "
                                 f"{gguf.architecture} model (unexpected tensor)")
        module = name.rsplit(".", 1)[0]
        role = info.name.split(".")[-2]
        rows = unpermute_rows(info.shape[0], heads[role]) if permute and role in heads else None
        native = fmt is not None and name.endswith(".weight") and module in fmt.native
        yield _tensor(gguf, info, name, native, rows, minus_one and name.endswith("norm.weight"))
        if name == "model.embed_tokens.weight" and fmt is not None and fmt.head_from_embedding:
            yield _tensor(gguf, info, "lm_head.weight", True, None)


def _tensor(gguf: GGUFFile, info: GGUFTensorInfo, name: str, native: bool, rows: torch.Tensor | None,
            minus_one: bool = False) -> CheckpointTensor:
    served = served_type(info.type_name) if native else None
    shape = (info.shape[0], row_bytes(served, info.shape[-1])) if served else info.shape

    def read(index: tuple[slice, ...] | None) -> torch.Tensor:
        if served is None:
            t = dequantize_info(gguf, info)
        else:
            t = raw_blocks(gguf, info)
            t = t if served == info.type_name else q5_0_as_q8_0(t)
        if minus_one:  # stored 1 + w (names.NORM_PLUS_ONE)
            t = t.float() - 1.0
        if rows is not None:
            t = t[rows]
        return t if index is None else t[index]

    return CheckpointTensor(name, shape, read)
