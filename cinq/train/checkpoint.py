"""Resumable training checkpoints: model + extra trainable modules + optimizer + progress, written atomically.

A checkpoint is one safetensors file: the tensors, plus the nesting of the state (dicts, lists, numbers,
strings) as JSON in its metadata, each tensor there replaced by the name it is stored under. Reading one back
never unpickles anything, like every other load in cinq.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

_META_KEY = "cinq_state"


def _flatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        name = f"t{len(tensors)}"
        # A copy per tensor: safetensors refuses tensors that share storage (tied embeddings do).
        tensors[name] = obj.detach().to("cpu").contiguous().clone()
        return {"__tensor__": name}
    if isinstance(obj, dict):
        # Key/value pairs, not a JSON object: optimizer state is keyed by ints, which JSON would turn to strings.
        return {"__dict__": [[k, _flatten(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return [_flatten(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"checkpoint: cannot store a value of type {type(obj).__name__}")


def _unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        return {k: _unflatten(v, tensors) for k, v in obj["__dict__"]}
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    return obj


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` (tensors and plain values, nested in dicts and lists) to ``path`` via a temporary file, so
    a crash mid-write never leaves a torn checkpoint."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    tree = _flatten(state, tensors)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={_META_KEY: json.dumps(tree)})
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> dict[str, Any] | None:
    """The saved state, or None when there is no checkpoint at ``path``."""
    path = Path(path)
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if _META_KEY not in meta:
            raise ValueError(f"{path}: not a cinq checkpoint (no {_META_KEY!r} in its safetensors metadata)")
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    return _unflatten(json.loads(meta[_META_KEY]), tensors)
