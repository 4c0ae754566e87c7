"""Whether a folder holds a speculative-decoding head rather than a model, from its config.json: the ``cinq_spec``
object cinq writes into every head folder (cinq/spec/head_folder.py), or, for a head from elsewhere (vLLM's,
SpecForge's), an ``architectures`` entry naming EAGLE or Medusa (``EagleLlamaForCausalLM``,
``LlamaForCausalLMEagle3``, ``MedusaModel``) or ``model_type`` medusa. Loaded as a model, a head failed deep in
the loader ("checkpoint tensor 'd2t' has no place in LlamaForCausalLM"); the loader and the CLI ask here first."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def read_config(folder: str | Path) -> dict[str, Any] | None:
    """A folder's config.json as a dict, or None when there is none to read: a GGUF file, a missing or
    unreadable config.json. The model loader reports those precisely; this check only looks."""
    from cinq.errors import ModelLoadError
    from cinq.model.folder_files import read_json
    try:
        return read_json(Path(folder) / "config.json")
    except (ModelLoadError, OSError, ValueError):
        return None


def speculative_head_method(folder: str | Path) -> str | None:
    """The speculative method (``eagle``, ``eagle3``, ``medusa``) of the head ``folder`` holds, or None when it is
    not a head folder (a model folder, a GGUF file, anything unreadable)."""
    cfg = read_config(folder)
    if cfg is None:
        return None
    spec = cfg.get("cinq_spec")
    if isinstance(spec, dict) and isinstance(spec.get("method"), str):
        return spec["method"]
    archs = cfg.get("architectures")
    names = " ".join(a for a in archs if isinstance(a, str)).lower() if isinstance(archs, list) else ""
    for marker in ("eagle3", "eagle", "medusa"):  # eagle3 first: "eagle" is a prefix of it
        if marker in names:
            return marker
    return "medusa" if cfg.get("model_type") == "medusa" else None
