"""EAGLE and EAGLE-3 draft heads: one decoder layer that drafts from the target's own hidden states.

EAGLE (Li et al. 2024): at position t the head reads ``fc(concat(embed(x_{t+1}), f_t))`` — the token after t,
embedded with the *target's* embedding, and the target's final normed hidden state ``f_t`` — runs one decoder
layer, and outputs a feature that regresses ``f_{t+1}``; the target's LM head turns it into a guess at
``x_{t+2}``. To draft further, the output feature replaces the target's and the guessed token the real one.

EAGLE-3 (Li et al. 2025): the target feature is fused from a low, a middle and a high layer
(``fuse_fc(concat(...))``), the head ends in its own RMSNorm before the target's LM head, and it is trained
only on the target's distributions, unrolled over its own outputs ("training-time test",
cinq/spec/eagle_unroll.py); the pre-norm output is what chains.

The decoder layer is the target family's (``decoder_layer``, cinq/model/interface.py; Llama's for every head so
far): served, it runs over the paged KV cache with the target's ``AttentionMetadata`` and positions; in training
(``meta=None``, [B, S] inputs) it is plain causal attention.
The head owns no embedding and no LM head: it borrows the target's (no copy; they are not submodules, so the
head's ``state_dict``, ``.to()`` and ``parameters()`` never touch the target's weights).

``feature_layers`` index the ``states`` list of ``LlamaModel.forward(..., output_hidden_states=True)``:
``states[i]`` is the input of layer i (residual included), ``states[L]`` the final normed hidden state.
EAGLE reads ``(L,)``. EAGLE-3 reads vLLM's choice ``(2, L // 2, L - 3)`` when those are three distinct layers
(L >= 8), else ``(1, L // 2, L - 1)`` (cinq-tiny, L = 5: (1, 2, 4)), else ``(0, L // 2, L)``.

Folder layout (config.json + model.safetensors, cinq/spec/head_folder.py):

* ``eagle``: vLLM's EAGLE-1 Llama layout (``EagleLlamaForCausalLM``): ``fc.weight`` [H, 2H] over
  ``concat(embeds, feature)`` (embeddings first, as vLLM), ``layers.0.*`` under HF Llama names (separate
  q/k/v and gate/up) without ``input_layernorm`` (EAGLE skips it); no embedding or LM head (the target's).
  The output is ``hidden + residual``, with no final norm.
* ``eagle3`` (cinq's earlier layout, still read and written; new heads with a reduced draft vocabulary use
  vLLM's / SpecForge's EAGLE-3 layout, cinq/spec/eagle3.py, which ``load_eagle_head`` also reads): architectures
  ``CinqEagle3LlamaForCausalLM``, ``fuse_fc.weight`` [H, len(feature_layers) * H], ``embedding_layernorm`` and
  ``hidden_states_layernorm`` (vLLM's HASS names, applied before ``fc``), ``fc.weight`` [H, 2H],
  ``layers.0.*`` as above, ``norm.weight``.

Both carry ``cinq_spec`` (method, feature layers, target fingerprint, training record) in config.json.
"""

from __future__ import annotations

from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from cinq.kernels.metadata import AttentionMetadata
from cinq.layers.linear import make_linear
from cinq.layers.norm import RMSNorm
from cinq.model.checkpoint_names import checkpoint_state_dict
from cinq.model.config import ModelConfig
from cinq.model.folder_files import read_json
from cinq.model.interface import CausalLM
from cinq.model.llama import STACKED_PARAMS_MAPPING
from cinq.model.registry import ModelRegistry
from cinq.model.loader import default_dtype, parse_dtype
from cinq.model.saver import hf_config_dict
from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.spec.eagle3 import ARCHITECTURES, load_eagle3_head
from cinq.spec.eagle_features import HeadLayer, check_feature_layers, default_feature_layers, head_layer_config
from cinq.spec.head_folder import HeadSpec, TargetFingerprint, load_into, read_head_config, write_head_folder

__all__ = ["EAGLE_METHODS", "EagleHead", "default_feature_layers", "head_layer_config", "load_eagle_head",
           "new_eagle_head", "save_eagle_head"]
EAGLE_METHODS = ("eagle", "eagle3")
_ARCHITECTURES = {"eagle": "EagleLlamaForCausalLM", "eagle3": "CinqEagle3LlamaForCausalLM"}


class EagleHead(HeadLayer):
    """One EAGLE / EAGLE-3 draft head (see the module docstring). ``config`` is its decoder layer's config
    (``num_hidden_layers == 1``): the runner sizes the head's paged KV from it."""

    stacked_params_mapping = STACKED_PARAMS_MAPPING

    def __init__(self, config: ModelConfig, method: str, feature_layers: tuple[int, ...],
                 embed_tokens: nn.Embedding, spec: HeadSpec, attention_backend: str = "sdpa",
                 dtype: torch.dtype | None = None,
                 target_logits: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        super().__init__()
        if method not in EAGLE_METHODS:
            raise InvalidParameterError(f"EAGLE head method must be one of {list(EAGLE_METHODS)}, got {method!r}",
                                        "method")
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.config = config
        self.method = method
        self.feature_layers = tuple(feature_layers)
        self.spec = spec
        # A tuple, not an attribute nn.Module would register: the target's embedding stays the target's.
        self._target_embed = (embed_tokens,)
        self._target_logits = (target_logits,)
        if method == "eagle3":
            self.fuse_fc = make_linear(len(self.feature_layers) * hidden, hidden, False, None, "fuse_fc", dtype)
            self.embedding_layernorm = RMSNorm(hidden, eps)
            self.hidden_states_layernorm = RMSNorm(hidden, eps)
        self.fc = make_linear(2 * hidden, hidden, False, None, "fc", dtype)
        layer = ModelRegistry.model_class(config.architecture).decoder_layer(config, "layers.0", attention_backend,
                                                                             dtype)
        # EAGLE feeds fc's output to attention unnormalised (vLLM's EAGLE-1 layout has no such tensor)
        layer.input_layernorm = nn.Identity()
        self.layers = nn.ModuleList([layer])
        self.norm = RMSNorm(hidden, eps) if method == "eagle3" else None

    def fuse(self, features: list[torch.Tensor]) -> torch.Tensor:
        """The target states at ``feature_layers`` (each [..., H]) -> the head's input feature [..., H]."""
        if len(features) != len(self.feature_layers):
            raise ValueError(f"{self.method} head: expected {len(self.feature_layers)} feature tensors (layers "
                             f"{self.feature_layers}), got {len(features)}")
        if self.method == "eagle":
            return features[0]
        return self.fuse_fc(torch.cat(features, dim=-1))

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings from the target's table."""
        return self._target_embed[0](token_ids)

    def forward(self, token_ids: torch.Tensor, feature: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata | None) -> tuple[torch.Tensor, torch.Tensor]:
        """token_ids [T] (the token AFTER each feature's position), feature [T, H] (fused target feature, or the
        head's own previous output when chaining) at ``positions``; [B, S] / [B, S, H] without ``meta``.

        Returns (next_feature to feed back when chaining, normed state for ``target.compute_logits``); for EAGLE
        both are the same tensor."""
        embeds = self.embed(token_ids)
        if self.norm is not None:
            embeds = self.embedding_layernorm(embeds)
            feature = self.hidden_states_layernorm(feature)
        x = self.fc(torch.cat([embeds.to(feature.dtype), feature], dim=-1))
        hidden, residual = self.layer_forward(positions, x, x, meta)  # its input norm is the identity
        if self.norm is None:
            out = hidden + residual
            return out, out
        normed, prenorm = self.norm(hidden, residual)
        return prenorm, normed

    def compute_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """[..., V] logits of the draft: through the target's LM head (this head has none of its own)."""
        if self._target_logits[0] is None:
            raise ValueError("EAGLE head built without the target's compute_logits")
        return self._target_logits[0](normed)

    def draft_vocab(self) -> None:
        """None: this head drafts over the target's whole vocabulary (``Eagle3Head.draft_vocab``)."""
        return None

    def hf_config(self, dtype: torch.dtype | None = None) -> dict[str, Any]:
        """config.json of this head's folder."""
        cfg = hf_config_dict(self.config, dtype)
        cfg["architectures"] = [_ARCHITECTURES[self.method]]
        cfg["cinq_spec"] = self.spec.to_dict()
        return cfg


def new_eagle_head(target: CausalLM, method: str, feature_layers: tuple[int, ...] | None = None,
                   seed: int = 0, attention_backend: str = "sdpa", target_name: str = "") -> EagleHead:
    """A freshly initialised head for ``target`` (float32, on the target's device): N(0, 0.02) matrices, unit
    norms."""
    num_layers = target.config.num_hidden_layers
    layers = tuple(feature_layers) if feature_layers is not None else default_feature_layers(method, num_layers)
    check_feature_layers(method, layers, num_layers, "new head")
    spec = HeadSpec(method, TargetFingerprint.of(target, target_name), layers)
    device = target.model.embed_tokens.weight.device
    with default_dtype(torch.float32), torch.device(device):
        head = EagleHead(head_layer_config(target.config), method, layers, target.model.embed_tokens, spec,
                         attention_backend, target_logits=target.compute_logits)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return head


def load_eagle_head(path: str | Path, target: CausalLM, dtype: torch.dtype | str, device: torch.device | str,
                    attention_backend: str) -> EagleHead:
    """Load a head folder onto ``target`` (sharing its embedding and LM head). Refuses, naming the field, a head
    trained for another target: InvalidParameterError(..., "model")."""
    cfg_file = Path(path) / "config.json"
    cfg = read_json(cfg_file) if cfg_file.is_file() else {}
    if any(a in ARCHITECTURES for a in cfg.get("architectures") or ()):  # vLLM's / SpecForge's EAGLE-3 layout
        return load_eagle3_head(path, cfg, target, parse_dtype(dtype), device, attention_backend)
    cfg, spec = read_head_config(path, EAGLE_METHODS)
    source = str(Path(path) / "config.json")
    spec.target.check(target, source)
    config = ModelConfig.from_dict({k: v for k, v in cfg.items() if k != "architectures"}, source)
    if config.num_hidden_layers != 1:
        raise ModelLoadError(f"{source}: an EAGLE head has one decoder layer, num_hidden_layers is "
                             f"{config.num_hidden_layers}", "model")
    if config.hidden_size != target.config.hidden_size:  # the probe agreed, so only a hand-edited config gets here
        raise InvalidParameterError(f"{source}: hidden_size {config.hidden_size} is not the target's "
                                    f"{target.config.hidden_size}", "model")
    check_feature_layers(spec.method, spec.feature_layers, target.config.num_hidden_layers, source)
    dtype = parse_dtype(dtype)
    with default_dtype(dtype), torch.device(device):
        head = EagleHead(config, spec.method, spec.feature_layers, target.model.embed_tokens, spec,
                         attention_backend, dtype, target.compute_logits)
    load_into(head, path)
    return head.eval()


def save_eagle_head(head: EagleHead, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write the head folder (weights in ``dtype``, default: as they are)."""
    tensors = checkpoint_state_dict(head)
    extra = head.extra_tensors() if hasattr(head, "extra_tensors") else {}
    if dtype is not None:
        tensors = {k: t.to(dtype) if t.is_floating_point() else t for k, t in tensors.items()}
    stored = dtype or next(head.parameters()).dtype
    return write_head_folder(path, head.hf_config(stored), {**tensors, **extra})
