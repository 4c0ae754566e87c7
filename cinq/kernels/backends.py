"""Attention backends: one interface, several implementations chosen by name.

Every backend takes the same inputs and returns the same outputs:

* ``write_kv(key, value, kv_cache, slot_mapping)`` stores the step's new K/V ([T, Hkv, D]) into the paged cache
  ``kv_cache`` ([2, num_blocks, block_size, Hkv, D]) at the flat slots of ``slot_mapping``.
* ``forward(query, key, value, kv_cache, meta, scale, out=None)`` returns [T, Hq, D]: each new token attends
  causally to its whole context read through the block tables (the new tokens' K/V are already in the cache).
  With ``out`` given, the result is written there (and returned).

Backends: ``"sdpa"`` (CPU default, PyTorch's fused kernel), ``"flash-torch"`` (FlashAttention-2 written in
PyTorch, the executable explanation), ``"triton"`` (CUDA default; registered when the triton package is
installed, imported on first use), ``"reference"`` (naive, float64: the ground truth), ``"contiguous"`` (the
virtual-contiguous layout's, ``kv_cache_layout="virtual"``: ``contiguous.py``). The math lives in
``sdpa.py``, ``flash.py``, ``triton/`` and ``reference.py``; this module is the registry and thin adapters.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from cinq.errors import InvalidParameterError
from cinq.kernels.contiguous import ContiguousBackend
from cinq.kernels.cpu_native import write_kv_native
from cinq.kernels.flash import flash_attention_paged
from cinq.kernels.metadata import AttentionMetadata
from cinq.kernels.paged import (  # noqa: F401  (re-exported: part of this module's public surface)
    causal_mask,
    check_inputs,
    gather_context,
    write_kv_index_copy,
)
from cinq.kernels.reference import paged_attention_reference
from cinq.kernels.sdpa import sdpa_paged_attention


class AttentionBackend(Protocol):
    """What an attention implementation provides to the Attention layer."""

    name: str

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None: ...

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None) -> torch.Tensor: ...


class TorchKVWriter:
    """KV writes shared by the PyTorch backends: the native copy on the CPU (one call per layer), else
    ``index_copy_`` into the flat cache view."""

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        if not write_kv_native(key, value, kv_cache, slot_mapping):
            write_kv_index_copy(key, value, kv_cache, slot_mapping)


class SdpaBackend(TorchKVWriter):
    """CPU default: ``scaled_dot_product_attention`` (it dispatches to PyTorch's flash CPU kernel)."""

    name = "sdpa"

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
        check_inputs(query, kv_cache, meta, key, value, out)
        return sdpa_paged_attention(query, key, value, kv_cache, meta, scale, out)


class FlashTorchBackend(TorchKVWriter):
    """FlashAttention-2 in PyTorch over the paged cache: tiles, online softmax, O(N) memory. Clear, not fast."""

    name = "flash-torch"

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
        check_inputs(query, kv_cache, meta, key, value, out)
        return flash_attention_paged(query, kv_cache, meta, scale, out=out)[0]


class ReferenceBackend(TorchKVWriter):
    """Naive attention with the score matrix materialised in float64: the ground truth for tests."""

    name = "reference"

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
        check_inputs(query, kv_cache, meta, key, value, out)
        ref, _ = paged_attention_reference(query, kv_cache, meta, scale)
        if out is None:
            return ref.to(query.dtype)
        out.copy_(ref)
        return out


class TritonBackend:
    """CUDA default: Triton flash prefill (varlen, paged, GQA), split-K paged decode and KV write kernels.

    Importing the kernels (and triton) happens here, on first construction, never at ``cinq`` import.
    """

    name = "triton"

    def __init__(self) -> None:
        try:
            from cinq.kernels.triton import decode, kv_write, prefill
        except ImportError as e:
            raise InvalidParameterError(
                f"attention_backend 'triton' needs the triton package ({e}); use 'sdpa' instead",
                param="attention_backend") from e
        self._decode, self._prefill, self._kv_write = decode, prefill, kv_write

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        self._kv_write.write_kv(key, value, kv_cache, slot_mapping)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                meta: AttentionMetadata, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
        check_inputs(query, kv_cache, meta, key, value, out)
        out = torch.empty_like(query) if out is None else out
        if meta.num_decodes:
            self._decode.paged_decode(query, kv_cache, meta, scale, out)
        if meta.num_seqs > meta.num_decodes:
            self._prefill.flash_prefill_paged(query, kv_cache, meta, scale, out, first_seq=meta.num_decodes)
        return out


def _triton_installed() -> bool:
    from cinq.kernels.triton import triton_available

    return triton_available()


_REGISTRY: dict[str, Callable[[], AttentionBackend]] = {
    "sdpa": SdpaBackend,
    "flash-torch": FlashTorchBackend,
    "reference": ReferenceBackend,
}
# Backends of the other KV layout (kv_cache_layout "virtual": one contiguous range per sequence), which cannot read
# the paged cache: selectable by name, listed apart.
_VIRTUAL_REGISTRY: dict[str, Callable[[], AttentionBackend]] = {"contiguous": ContiguousBackend}
if _triton_installed():
    _REGISTRY["triton"] = TritonBackend


def register_backend(name: str, factory: Callable[[], AttentionBackend]) -> None:
    """Make a backend selectable by name (``EngineConfig.attention_backend``)."""
    _REGISTRY[name] = factory


def available_backends(kv_cache_layout: str = "paged") -> list[str]:
    """Names ``get_backend`` accepts for a KV layout (paged: ``"triton"`` only where the triton package is
    installed; virtual: ``"contiguous"``)."""
    return sorted(_VIRTUAL_REGISTRY if kv_cache_layout == "virtual" else _REGISTRY)


def get_backend(name: str) -> AttentionBackend:
    """Instantiate the backend registered under ``name``; unknown names list the choices."""
    factory = _REGISTRY.get(name) or _VIRTUAL_REGISTRY.get(name)
    if factory is None:
        raise InvalidParameterError(
            f"attention_backend: unknown backend {name!r}; choose one of {available_backends()} (paged KV "
            f"layout) or {available_backends('virtual')} (virtual)", param="attention_backend")
    return factory()


def default_backend_name(device: torch.device | str) -> str:
    """``triton`` on CUDA when registered, else ``sdpa``."""
    if torch.device(device).type == "cuda" and "triton" in _REGISTRY:
        return "triton"
    return "sdpa"
