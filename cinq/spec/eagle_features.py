"""What every EAGLE head layout shares (cinq's EAGLE / EAGLE-3 ones, cinq/spec/eagle.py, and vLLM's EAGLE-3
one, cinq/spec/eagle3.py): which target states it reads, the shape of its one decoder layer, and that layer's
attention as the runner binds it.

``feature_layers`` index the ``states`` list of ``LlamaModel.forward(..., output_hidden_states=True)``:
``states[i]`` is the input of layer i (residual included), ``states[L]`` the final normed hidden state; vLLM's
``eagle_aux_hidden_state_layer_ids`` index the same states.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from cinq.errors import ModelLoadError
from cinq.kernels.backends import get_backend
from cinq.kernels.metadata import AttentionMetadata
from cinq.layers.attention import Attention
from cinq.model.config import ModelConfig
from cinq.model.decode_layers import DecodeLayers, build_decode_layers


class HeadLayer(nn.Module):
    """Base of the EAGLE heads: ``self.layers`` holds their decoder layer(s), whose attention the runner binds
    to the head's paged KV cache."""

    layers: nn.ModuleList
    _decode_layers: DecodeLayers | None | bool = False  # False: not built yet (``decode_layer``)

    def layer_forward(self, positions: torch.Tensor, x: torch.Tensor, residual: torch.Tensor,
                      meta: AttentionMetadata | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder layer on its input ``x``, already normed (the layouts norm and concatenate their inputs
        themselves), and ``residual``: (hidden, residual) after it. Through the fused decode program where it
        applies (``decode_layer``; bit-identical), else the Python layer."""
        fused = self.decode_layer() if meta is not None and x.is_cpu and not torch.compiler.is_compiling() else None
        out = fused.run(x, positions, meta, residual=residual) if fused is not None else None
        if out is not None:
            return out[0], out[1]
        layer = self.layers[0]
        hidden = layer.self_attn(positions, x, meta)
        hidden, residual = layer.post_attention_layernorm(hidden, residual)
        return layer.mlp(hidden), residual

    def decode_layer(self) -> DecodeLayers | None:
        """The head's layer as a fused decode program (cinq/model/decode_layers.py: its linears split across a
        team of spinning threads, no Python between its kernels), built once the runner has bound the head's KV
        cache and again when it binds another; None where the program does not apply (float32 heads, other
        linears, ``CINQ_FUSED_DECODE=0``). Through the Python layer, a draft step of SmolLM2's EAGLE-3 head spent
        most of its ~0.9 ms (2 threads) in dispatch and in waking OpenMP's sleeping workers for each linear."""
        fused = self._decode_layers
        if fused is False or (fused is not None and fused.stale()):
            if self.layers[0].self_attn.attn.kv_cache is None:
                return None  # not bound yet (training, offline evaluation): decided at a later call
            fused = self._decode_layers = build_decode_layers(self, normed_input=True)
        return fused

    def attention_layers(self) -> list[Attention]:
        """The head's attention layers (one); the runner binds their ``kv_cache``."""
        return [layer.self_attn.attn for layer in self.layers]

    def set_attention_backend(self, name: str) -> None:
        for attn in self.attention_layers():
            attn.backend = get_backend(name)


def default_feature_layers(method: str, num_layers: int) -> tuple[int, ...]:
    """The target states a head of ``method`` reads (see the module docstring)."""
    if method == "eagle":
        return (num_layers,)
    for layers in ((2, num_layers // 2, num_layers - 3), (1, num_layers // 2, num_layers - 1)):
        if layers[0] < layers[1] < layers[2]:
            return layers
    return (0, num_layers // 2, num_layers)


def head_layer_config(target: ModelConfig) -> ModelConfig:
    """The config of the head's one decoder layer: the target's shape, one layer, dense."""
    return dataclasses.replace(target, num_hidden_layers=1, quantization_config=None)


def check_feature_layers(method: str, layers: tuple[int, ...], num_layers: int, source: str) -> None:
    """Refuse (ModelLoadError naming the model) feature layers a head of ``method`` cannot read from a target of
    ``num_layers`` layers."""
    if method == "eagle" and layers != (num_layers,):
        raise ModelLoadError(f"{source}: an EAGLE head reads the final state, feature_layers ({num_layers},); got "
                             f"{layers}", "model")
    if not layers or any(not 0 <= i <= num_layers for i in layers):
        raise ModelLoadError(f"{source}: feature_layers {layers} must index the target's {num_layers + 1} states",
                             "model")
