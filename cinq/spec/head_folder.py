"""Speculative-head folders (EAGLE, EAGLE-3, Medusa): ``config.json`` + ``model.safetensors``, and the check that
a head is loaded onto the target it was trained for.

A head reads the target's hidden states and, for EAGLE, embeds tokens with the target's embedding and drafts
through the target's LM head: loaded onto another model it would draft garbage (or crash on a shape). Each
folder's config.json therefore carries, next to the layout's own keys, a ``cinq_spec`` object:

```
"cinq_spec": {"format": 1, "method": "eagle" | "eagle3" | "medusa", "feature_layers": [...],
              "target": {"name", "hidden_size", "vocab_size", "num_hidden_layers",
                         "embedding_probe": {"rows": [...], "dims": D, "values": [[...], ...]}, "fingerprint"},
              "training": {...how the head was trained: free-form, for model cards...}}
```

The probe is a few rows of the target's input embedding (``dims`` leading values of ``rows``); the check
compares them with a tolerance, so the same target loaded in bfloat16, float16 or float32 passes and any other
model fails. ``fingerprint`` (a hash of the probe rounded to bfloat16) names the target in logs and cards.

Reading goes through cinq's defensive model-folder readers (regular files, size caps, safetensors headers vetted
before safetensors sees them); nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from cinq.errors import InvalidParameterError, ModelLoadError
from cinq.layers.weight_loader import CheckpointTensor, check_and_copy
from cinq.model.checkpoint_names import expected_checkpoint_names, mapping_of, resolve
from cinq.model.folder_files import read_json
from cinq.model.loader import iter_checkpoint

FORMAT_VERSION = 1
METHODS = ("eagle", "eagle3", "medusa")
_PROBE_ROWS = 8
_PROBE_DIMS = 16
# Relative to the probe's largest magnitude: bf16 rounding moves a value by 2^-9 of itself, a different model's
# embedding by about its whole magnitude.
_PROBE_TOLERANCE = 2e-2


@dataclass(slots=True)
class TargetFingerprint:
    """What identifies the target a head was trained on (see the module docstring)."""

    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    probe_rows: list[int]
    probe_values: list[list[float]]
    name: str = ""

    @classmethod
    def of(cls, target: Any, name: str = "") -> TargetFingerprint:
        """The fingerprint of a loaded ``LlamaForCausalLM``."""
        c = target.config
        rows = sorted({round(i * (c.vocab_size - 1) / (_PROBE_ROWS - 1)) for i in range(_PROBE_ROWS)})
        values = _embedding_rows(target, rows, min(_PROBE_DIMS, c.hidden_size))
        return cls(c.hidden_size, c.vocab_size, c.num_hidden_layers, rows, values.tolist(), name)

    @property
    def fingerprint(self) -> str:
        probe = torch.tensor(self.probe_values, dtype=torch.float32).to(torch.bfloat16).view(torch.int16)
        return hashlib.sha256(probe.numpy().tobytes()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "hidden_size": self.hidden_size, "vocab_size": self.vocab_size,
                "num_hidden_layers": self.num_hidden_layers,
                "embedding_probe": {"rows": self.probe_rows, "dims": len(self.probe_values[0]),
                                    "values": self.probe_values},
                "fingerprint": self.fingerprint}

    @classmethod
    def from_dict(cls, d: Any, source: str) -> TargetFingerprint:
        try:
            probe = d["embedding_probe"]
            out = cls(int(d["hidden_size"]), int(d["vocab_size"]), int(d["num_hidden_layers"]),
                      [int(r) for r in probe["rows"]], [[float(v) for v in row] for row in probe["values"]],
                      str(d.get("name", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise ModelLoadError(f"{source}: cinq_spec.target is malformed ({e!r})", "model") from None
        if not out.probe_rows or len(out.probe_rows) != len(out.probe_values) \
                or len({len(r) for r in out.probe_values}) != 1:
            raise ModelLoadError(f"{source}: cinq_spec.target.embedding_probe rows and values disagree", "model")
        return out

    def check(self, target: Any, source: str) -> None:
        """Raise InvalidParameterError("...", "model") naming the first field in which ``target`` differs."""
        c = target.config
        for name in ("hidden_size", "vocab_size", "num_hidden_layers"):
            mine, theirs = getattr(self, name), getattr(c, name)
            if mine != theirs:
                raise InvalidParameterError(
                    f"{source}: this head was trained for a target with {name}={mine} ({self._named()}), the "
                    f"target has {name}={theirs}", "model")
        if max(self.probe_rows) >= c.vocab_size:
            raise InvalidParameterError(f"{source}: embedding probe rows exceed the target's vocabulary", "model")
        want = torch.tensor(self.probe_values, dtype=torch.float32)
        got = _embedding_rows(target, self.probe_rows, want.shape[1])
        diff = float((got - want).abs().max())
        scale = float(want.abs().max()) or 1.0
        if diff > _PROBE_TOLERANCE * scale:
            got_fp = TargetFingerprint(c.hidden_size, c.vocab_size, c.num_hidden_layers, self.probe_rows,
                                       got.tolist()).fingerprint
            raise InvalidParameterError(
                f"{source}: this head was trained for another target ({self._named()}): target fingerprint "
                f"{self.fingerprint} expected, this target's is {got_fp} (its embedding rows differ by up to "
                f"{diff:.3g})", "model")

    def _named(self) -> str:
        return f"{self.name!r}, fingerprint {self.fingerprint}" if self.name else f"fingerprint {self.fingerprint}"


def _embedding_rows(target: Any, rows: list[int], dims: int) -> torch.Tensor:
    weight = target.model.embed_tokens.weight
    return weight[torch.tensor(rows, device=weight.device), :dims].detach().float().cpu()


@dataclass(slots=True)
class HeadSpec:
    """The ``cinq_spec`` object of a head folder's config.json."""

    method: str
    target: TargetFingerprint
    feature_layers: tuple[int, ...] = ()
    training: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, "method": self.method, "feature_layers": list(self.feature_layers),
                "target": self.target.to_dict(), "training": self.training}

    @classmethod
    def from_dict(cls, d: Any, source: str) -> HeadSpec:
        if not isinstance(d, dict):
            raise ModelLoadError(f"{source}: no 'cinq_spec' object: not a head folder written by cinq (train one "
                                 f"with `cinq distill --heads ...`)", "model")
        if d.get("format") != FORMAT_VERSION:
            raise ModelLoadError(f"{source}: cinq_spec.format {d.get('format')!r} is not {FORMAT_VERSION}", "model")
        method = d.get("method")
        if method not in METHODS:
            raise ModelLoadError(f"{source}: cinq_spec.method must be one of {list(METHODS)}, got {method!r}",
                                 "model")
        layers = d.get("feature_layers", [])
        if not isinstance(layers, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise ModelLoadError(f"{source}: cinq_spec.feature_layers must be a list of integers", "model")
        training = d.get("training", {})
        return cls(method, TargetFingerprint.from_dict(d.get("target"), source), tuple(layers),
                   training if isinstance(training, dict) else {})


def read_head_config(path: str | Path, method: str | tuple[str, ...]) -> tuple[dict[str, Any], HeadSpec]:
    """The folder's config.json and its parsed ``cinq_spec``, which must be of ``method`` (one or several)."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.exists():
        raise ModelLoadError(f"{path}: no config.json (is this a head folder?)", "model")
    cfg = read_json(cfg_file)
    spec = HeadSpec.from_dict(cfg.get("cinq_spec"), str(cfg_file))
    allowed = (method,) if isinstance(method, str) else method
    if spec.method not in allowed:
        raise InvalidParameterError(f"{cfg_file}: a {spec.method!r} head, not {' or '.join(map(repr, allowed))}",
                                    "model")
    return cfg, spec


def head_tensors(path: str | Path) -> Iterator[CheckpointTensor]:
    """The folder's checkpoint tensors, unread until loaded (headers vetted first, as for models)."""
    return iter_checkpoint(Path(path))


def load_into(module: nn.Module, path: str | Path, tensors: Iterator[CheckpointTensor] | None = None) -> None:
    """Fill ``module``'s parameters from the folder's tensors (or ``tensors``, read from it and renamed), through the module's ``stacked_params_mapping``
    (HF's separate q/k/v and gate/up fill the merged projections), as the model loader does. Every tensor must
    have a place and a matching shape, and none may be missing; errors name the tensor."""
    modules = dict(module.named_modules())
    mapping = mapping_of(module)
    expected = expected_checkpoint_names(module)
    loaded: set[str] = set()
    for tensor in head_tensors(path) if tensors is None else tensors:
        place = resolve(modules, mapping, tensor.name)
        if place is None or tensor.name not in expected:
            raise ModelLoadError(f"{path}: checkpoint tensor '{tensor.name}' has no place in a "
                                 f"{type(module).__name__}", "model")
        owner = modules[place.module]
        loader = getattr(owner, "weight_loader", None)
        if loader is not None:
            loader(place.param, tensor, place.shard_id)
        else:
            check_and_copy(getattr(owner, place.param), tensor)
        loaded.add(tensor.name)
    missing = sorted(set(expected) - loaded)
    if missing:
        raise ModelLoadError(f"{path}: checkpoint is missing tensor(s) {missing[:5]}", "model")


def write_head_folder(path: str | Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    """Write config.json and model.safetensors (each via a temporary file, so a crash leaves no torn file)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    # safetensors refuses tensors sharing storage, and views of merged projections do: one copy each.
    flat = {name: t.detach().to("cpu").contiguous().clone() for name, t in tensors.items()}
    tmp = path / "model.safetensors.tmp"
    save_file(flat, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, path / "model.safetensors")
    tmp = path / "config.json.tmp"
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(tmp, path / "config.json")
    return path
