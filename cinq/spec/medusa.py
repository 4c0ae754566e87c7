"""Medusa-1 heads (Cai et al. 2024): extra decoding heads on the target's final hidden state, each guessing one
token further ahead, all from the same position.

Head i is a residual block ``x + SiLU(W x + b)`` followed by its own linear to the vocabulary (initialised from
the target's LM head, the block at zero, so an untrained head starts as the target's own next-token guess), or,
with ``original_lm_head`` (vLLM's name), by the target's own LM head, shared and frozen: a head is then only its
residual block (H^2 + H values instead of H^2 + H + V H).
At position t, where the target itself predicts x_{t+1}, head i predicts x_{t+2+i} (Medusa's convention: head 0
is the token after the next one). Drafting k tokens takes k heads and no extra pass of anything.

Folder layout: vLLM's Medusa one (config.json ``architectures: ["MedusaModel"]``, ``model_type: medusa``,
``hidden_size``, ``vocab_size``, ``num_heads``, ``num_hidden_layers`` (residual layers per head),
``medusa_fc_bias: true``, ``original_lm_head``; tensors ``blocks.{i}.layers.{j}.weight`` / ``.bias`` [H, H] / [H]
and ``lm_heads.{i}.weight`` [V, H]), plus ``cinq_spec`` (cinq/spec/head_folder.py) with the target fingerprint.
With ``original_lm_head: true`` cinq stores no LM head (it uses the target's); vLLM reads that one from
``lm_heads.0.weight``, so add the target's ``lm_head.weight`` under that name to load such a folder there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.layers.linear import make_linear
from cinq.model.llama import LlamaForCausalLM
from cinq.model.loader import default_dtype, parse_dtype
from cinq.spec.head_folder import HeadSpec, TargetFingerprint, load_into, read_head_config, write_head_folder

MAX_HEADS = 64


class ResidualBlock(nn.Module):
    """``x <- x + SiLU(layer(x))`` for each of its layers."""

    def __init__(self, hidden_size: int, num_layers: int, prefix: str, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(make_linear(hidden_size, hidden_size, True, None, f"{prefix}.layers.{j}", dtype)
                                    for j in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + F.silu(layer(x))
        return x


class MedusaHeads(nn.Module):
    """``num_heads`` Medusa heads over a target of ``hidden_size`` / ``vocab_size`` (see the module docstring)."""

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, spec: HeadSpec, num_layers: int = 1,
                 dtype: torch.dtype | None = None, target_lm_head: nn.Module | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads  # checked where it comes in: new_medusa_heads, load_medusa_heads
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        self.spec = spec
        self.blocks = nn.ModuleList(ResidualBlock(hidden_size, num_layers, f"blocks.{i}", dtype)
                                    for i in range(num_heads))
        # A tuple, not a registered submodule: the target's LM head stays the target's (state_dict, .to()).
        self._target_lm_head = (target_lm_head,) if target_lm_head is not None else None
        self.lm_heads = None if target_lm_head is not None else nn.ModuleList(
            make_linear(hidden_size, vocab_size, False, None, f"lm_heads.{i}", dtype) for i in range(num_heads))

    @property
    def original_lm_head(self) -> bool:
        """True when the heads draft through the target's LM head (stored nowhere here)."""
        return self._target_lm_head is not None

    def head_logits(self, hidden: torch.Tensor, i: int) -> torch.Tensor:
        """Head ``i``'s logits [..., V] (float32) for final normed target states [..., H]."""
        lm_head = self._target_lm_head[0] if self._target_lm_head is not None else self.lm_heads[i]
        return lm_head(self.blocks[i](hidden)).float()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final normed target hidden [T, H] -> logits [T, num_heads, V] float32; head i guesses the token i + 2
        positions after each row's position."""
        return torch.stack([self.head_logits(hidden, i) for i in range(self.num_heads)], dim=-2)

    def hf_config(self, dtype: torch.dtype | None = None) -> dict[str, Any]:
        """config.json of this head folder."""
        cfg: dict[str, Any] = {
            "architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size, "truncated_vocab_size": self.vocab_size, "num_heads": self.num_heads,
            "num_hidden_layers": len(self.blocks[0].layers), "medusa_fc_bias": True,
            "original_lm_head": self.original_lm_head,
        }
        if dtype is not None:
            cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
        cfg["cinq_spec"] = self.spec.to_dict()
        return cfg


def new_medusa_heads(target: LlamaForCausalLM, num_heads: int, num_layers: int = 1, target_name: str = "",
                     original_lm_head: bool = False) -> MedusaHeads:
    """Heads for ``target`` (float32, on its device): residual blocks at zero, LM heads copied from the target's
    (a dense one), or the target's own shared with ``original_lm_head``."""
    if not 1 <= num_heads <= MAX_HEADS:
        raise InvalidParameterError(f"medusa: num_heads must be in [1, {MAX_HEADS}], got {num_heads}", "num_heads")
    c = target.config
    spec = HeadSpec("medusa", TargetFingerprint.of(target, target_name))
    device = target.model.embed_tokens.weight.device
    lm_weight = getattr(target.lm_head, "weight", None)
    if lm_weight is None and not original_lm_head:
        raise InvalidParameterError("medusa: the target's LM head is quantized; train heads on a dense target",
                                    "target")
    with default_dtype(torch.float32), torch.device(device):
        heads = MedusaHeads(c.hidden_size, c.vocab_size, num_heads, spec, num_layers,
                            target_lm_head=target.lm_head if original_lm_head else None)
    with torch.no_grad():
        for block in heads.blocks:
            for layer in block.layers:
                layer.weight.zero_()
                layer.bias.zero_()
        for lm in heads.lm_heads or ():
            lm.weight.copy_(lm_weight.float())
    return heads


def load_medusa_heads(path: str | Path, target: LlamaForCausalLM, dtype: torch.dtype | str,
                      device: torch.device | str) -> MedusaHeads:
    """Load a Medusa folder for ``target``; refuses heads trained for another target, naming the field
    (InvalidParameterError(..., "model"))."""
    cfg, spec = read_head_config(path, "medusa")
    source = str(Path(path) / "config.json")
    spec.target.check(target, source)
    sizes = {}
    for key, limit in (("num_heads", MAX_HEADS), ("num_hidden_layers", 64), ("hidden_size", 1 << 16),
                       ("vocab_size", 1 << 22)):
        value = cfg.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
            raise ModelLoadError(f"{source}: {key} must be an integer in [1, {limit}], got {value!r}", "model")
        sizes[key] = value
    for key in ("hidden_size", "vocab_size"):
        if sizes[key] != getattr(target.config, key):
            raise InvalidParameterError(f"{source}: {key} {sizes[key]} is not the target's "
                                        f"{getattr(target.config, key)}", "model")
    if cfg.get("medusa_fc_bias") is not True:
        raise ModelLoadError(f"{source}: cinq's Medusa heads have biased residual layers (medusa_fc_bias: true)",
                             "model")
    shared = cfg.get("original_lm_head", False)
    if not isinstance(shared, bool):
        raise ModelLoadError(f"{source}: original_lm_head must be true or false, got {shared!r}", "model")
    dtype = parse_dtype(dtype)
    with default_dtype(dtype), torch.device(device):
        heads = MedusaHeads(sizes["hidden_size"], sizes["vocab_size"], sizes["num_heads"], spec,
                            sizes["num_hidden_layers"], dtype, target.lm_head if shared else None)
    load_into(heads, path)
    return heads.eval()


def save_medusa_heads(heads: MedusaHeads, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write the head folder (weights in ``dtype``, default: as they are)."""
    tensors = {k: (t.to(dtype) if dtype is not None and t.is_floating_point() else t)
               for k, t in heads.state_dict().items()}
    return write_head_folder(path, heads.hf_config(dtype or next(heads.parameters()).dtype), tensors)
