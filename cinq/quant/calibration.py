"""Calibration: text -> token windows, and running a model one decoder block at a time.

Peak memory stays about one decoder block (float32) plus the calibration activations: blocks are read from the
safetensors files only when their turn comes, and the hidden states of every calibration window are carried
from one block to the next. Hooks on a block's linears hand each method the inputs it needs (Hessians for
GPTQ, activation magnitudes for AWQ / SmoothQuant).
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.layers.linear import DenseLinear
from cinq.model.config import ModelConfig
from cinq.model.loader import checkpoint_files
from cinq.model.registry import ModelRegistry

# Linears of a decoder block in execution order, grouped by the input they share.
BLOCK_LINEARS: tuple[tuple[str, ...], ...] = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("self_attn.o_proj",),
    ("mlp.gate_proj", "mlp.up_proj"),
    ("mlp.down_proj",),
)


def calibration_tokens(path: str | Path | None, tokenizer: Any, n_samples: int, seq_len: int,
                       seed: int = 0) -> torch.Tensor:
    """[n, seq_len] token windows drawn (seeded) from the text file ``path``; fewer than ``n_samples`` when the
    text is short. Raises InvalidParameterError naming --calib when there is no usable file."""
    if path is None:
        raise InvalidParameterError("--calib FILE is required: calibration text must come from a local file "
                                    "(cinq never downloads a data set)", "calib")
    path = Path(path)
    if not path.is_file():
        raise InvalidParameterError(f"--calib: {path} is not a readable file", "calib")
    return calibration_windows(_encode(tokenizer, path.read_text(encoding="utf-8", errors="replace")),
                               n_samples, seq_len, seed)


def _encode(tokenizer: Any, text: str) -> list[int]:
    out = tokenizer.encode(text, add_special_tokens=False)
    return list(out.ids) if hasattr(out, "ids") else list(out)


def calibration_windows(ids: Sequence[int], n_samples: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    """Up to ``n_samples`` windows of ``seq_len`` tokens from ``ids``: disjoint when the text allows, else random
    overlapping starts (seeded)."""
    if n_samples < 1 or seq_len < 2:
        raise InvalidParameterError(f"calibration needs n_samples >= 1 and seq_len >= 2, got {n_samples}, {seq_len}",
                                    "calib_samples")
    ids = torch.as_tensor(list(ids), dtype=torch.long)
    if ids.numel() < seq_len:
        raise InvalidParameterError(f"--calib: the text has {ids.numel()} tokens, fewer than one window of "
                                    f"{seq_len}; give more text or a smaller --calib-seq-len", "calib")
    starts = list(range(0, ids.numel() - seq_len + 1, seq_len))
    rng = random.Random(seed)
    if len(starts) >= n_samples:
        starts = sorted(rng.sample(starts, n_samples))
    elif ids.numel() >= 2 * seq_len:  # short text: add overlapping windows
        extra = [rng.randrange(0, ids.numel() - seq_len + 1) for _ in range(n_samples - len(starts))]
        starts = starts + extra
    return torch.stack([ids[s:s + seq_len] for s in starts])


class CheckpointReader:
    """Random access to a dense model folder's tensors by name, and its decoder blocks one at a time."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.config = ModelConfig.from_pretrained(self.path)
        if self.config.quantization_config:
            method = self.config.quantization_config.get("quant_method")
            how = (f"; to requantize its values, write them as a dense folder first: cinq export {self.path} "
                   f"--format hf --out DIR") if method == "gguf" else ""
            raise ModelLoadError(f"{self.path}: already quantized ({method}); quantize a dense model{how}")
        self.raw_config: dict[str, Any] = json.loads((self.path / "config.json").read_text())
        self._where: dict[str, Path] = {}
        for file in checkpoint_files(self.path):
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for name in f.keys():
                    self._where[name] = file

    def names(self) -> list[str]:
        return list(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def tensor(self, name: str) -> torch.Tensor:
        file = self._where.get(name)
        if file is None:
            raise ModelLoadError(f"{self.path}: checkpoint has no tensor '{name}'")
        with safe_open(str(file), framework="pt", device="cpu") as f:
            return f.get_tensor(name)

    def dtype(self) -> torch.dtype:
        """Storage dtype of the dense weights (that of the embedding)."""
        return self.tensor("model.embed_tokens.weight").dtype

    def block(self, index: int) -> nn.Module:
        """Decoder block ``index`` in float32 with its checkpoint weights."""
        prefix = f"model.layers.{index}"
        # HF's separate projections: calibration hooks, GPTQ/AWQ/SmoothQuant and the writer work per projection.
        block = ModelRegistry.model_class(self.config.architecture).decoder_layer(
            self.config, prefix, "sdpa", merge_projections=False, layer_index=index)
        state = {}
        for name, p in block.named_parameters():
            t = self.tensor(f"{prefix}.{name}")
            if tuple(t.shape) != tuple(p.shape):
                raise ModelLoadError(f"checkpoint tensor '{prefix}.{name}': shape {tuple(t.shape)} does not match "
                                     f"the model's {tuple(p.shape)}")
            state[name] = t.float()
        block.load_state_dict(state, strict=True)
        return block.eval()


@dataclass(slots=True)
class BlockState:
    """What flows between decoder blocks for every calibration window: hidden [n, S, H] and residual (None
    before block 0), plus positions [n, S]."""

    hidden: torch.Tensor
    residual: torch.Tensor | None
    positions: torch.Tensor

    @classmethod
    def from_tokens(cls, reader: CheckpointReader, tokens: torch.Tensor,
                    dtype: torch.dtype = torch.float32) -> BlockState:
        embed = reader.tensor("model.embed_tokens.weight")
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        hidden = embed[tokens].to(dtype)
        scale = ModelRegistry.model_class(reader.config.architecture).embed_scale(reader.config)
        return cls(hidden if scale is None else hidden * torch.tensor(scale, dtype=dtype), None, positions)


class StopForward(Exception):
    """Raised by a capture hook once the inputs it needs are seen, to skip the rest of the block."""


def run_block(block: nn.Module, state: BlockState, batch: int = 8, keep_output: bool = True) -> BlockState | None:
    """The next block's state: ``block`` over every window, ``batch`` windows per forward. Forwards stopped by
    a hook (StopForward) are fine when ``keep_output`` is False."""
    outs, ress = [], []
    n = state.hidden.shape[0]
    with torch.inference_mode():
        for lo in range(0, n, batch):
            res = None if state.residual is None else state.residual[lo:lo + batch]
            try:
                out, res = block(state.positions[lo:lo + batch], state.hidden[lo:lo + batch], res, None)
            except StopForward:
                if keep_output:
                    raise
                continue
            if keep_output:
                outs.append(out)
                ress.append(res)
    if not keep_output:
        return None
    # a family whose blocks return the whole residual stream as hidden (Gemma 3) carries no residual
    return BlockState(torch.cat(outs), None if ress[0] is None else torch.cat(ress), state.positions)


def block_linears(block: nn.Module) -> dict[str, DenseLinear]:
    """The block's dense linears by local name (``self_attn.q_proj`` ...)."""
    return {name: m for name, m in block.named_modules() if isinstance(m, DenseLinear)}


@contextlib.contextmanager
def capture_inputs(block: nn.Module, names: Sequence[str], fn: Callable[[str, torch.Tensor], None],
                   stop_after: str | None = None) -> Iterator[None]:
    """Call ``fn(name, x)`` with the input x [..., K] of each linear in ``names`` on every forward; raise
    StopForward after ``stop_after`` has been seen."""
    linears = block_linears(block)
    handles = []

    def make_hook(name: str):
        def hook(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            fn(name, args[0])
            if name == stop_after:
                raise StopForward
        return hook

    for name in names:
        handles.append(linears[name].register_forward_pre_hook(make_hook(name)))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def set_weight(linear: DenseLinear, w: torch.Tensor) -> None:
    """Replace a linear's weight values in place (keeps the parameter object)."""
    with torch.no_grad():
        linear.weight.copy_(w.to(linear.weight.dtype))
