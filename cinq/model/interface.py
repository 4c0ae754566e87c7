"""CausalLM: what the rest of cinq asks of a model family (vLLM's ``SupportsXxx`` interfaces, in one protocol).

Who needs what:

* the loader and the saver: ``__init__(config, quant, attention_backend, dtype)`` on the meta device, the HF
  checkpoint names of its parameters (module names mirror HF's, merged projections declared in
  ``stacked_params_mapping``), ``tie_weights()``;
* the runner: ``forward(input_ids, positions, meta)`` -> final hidden states, ``compute_logits(hidden)``,
  ``attention_layers()`` (to bind the paged KV cache), ``set_attention_backend(name)``,
  ``forward_with_hidden_states(input_ids, positions, meta, state_ids)`` (EAGLE's features: every layer's input
  and the final normed state, or the ones ``state_ids`` names);
* tensor parallelism: layers built under ``building_shard`` read ``current_shard()`` (``model/tp_layout.py``);
* the spec proposers (``spec/eagle.py``, ``spec/medusa.py``): ``model.embed_tokens`` (the token table) and
  ``decoder_layer(...)`` (one decoder block of the family, the EAGLE head's layer);
* the quantizer's calibration (``quant/calibration.py``): ``decoder_layer(..., merge_projections=False)`` with
  HF's separate linears, called ``block(positions [B, S], hidden, residual, None) -> (hidden, residual)``, and
  ``embed_scale(config)`` (what the token embedding is multiplied by before block 0).

``unsupported`` names the engine features a family does not implement yet (feature -> why); the engine refuses
them with that sentence (``check_supported``) rather than serving wrong numbers.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import nn

from cinq.errors import InvalidParameterError


@runtime_checkable
class CausalLM(Protocol):
    """A decoder-only language model as cinq serves it (``model/llama.py`` is the reference implementation)."""

    config: Any
    model: nn.Module  # .embed_tokens, .layers, .norm
    stacked_params_mapping: ClassVar[tuple[tuple[str, str, str | int], ...]]
    unsupported: ClassVar[dict[str, str]]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                meta: Any = None) -> torch.Tensor: ...

    def forward_with_hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                                   meta: Any = None, state_ids: tuple[int, ...] | None = None
                                   ) -> tuple[torch.Tensor, list[torch.Tensor]]: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor: ...

    def tie_weights(self) -> None: ...

    def set_attention_backend(self, name: str) -> None: ...

    def attention_layers(self) -> list[nn.Module]: ...

    @classmethod
    def decoder_layer(cls, config: Any, prefix: str, attention_backend: str = "sdpa",
                      dtype: torch.dtype | None = None, merge_projections: bool = True,
                      layer_index: int = 0) -> nn.Module: ...

    @classmethod
    def embed_scale(cls, config: Any) -> float | None: ...


def check_supported(model_cls: type, feature: str, param: str) -> None:
    """Refuse ``feature`` (e.g. "tensor_parallel") for a family that lists it in ``unsupported``; the error names
    the architecture, what is missing and the engine field (``param``)."""
    why = getattr(model_cls, "unsupported", {}).get(feature)
    if why is not None:
        raise InvalidParameterError(f"{model_cls.__name__} does not support {feature} yet: {why}", param)
