"""The MODEL argument of the commands that run the engine: its help (the names the CLI accepts, read from the
same registry ``cinq.assets.resolve_model_path`` resolves them with) and the check that it is a model, not a
speculative-decoding head.

The embedded assets hold heads (cinq-tiny-eagle, smollm2-135m-instruct-eagle3, ...) next to models, and
``resolve_model_path`` accepts both; loaded as a model, a head fails deep in the loader ("checkpoint tensor 'd2t'
has no place in LlamaForCausalLM"). A head is recognised by its config.json: the ``cinq_spec`` object cinq writes
into every head folder (cinq/spec/head_folder.py), or, for a head from elsewhere (vLLM's, SpecForge's), an
``architectures`` entry naming EAGLE or Medusa (``EagleLlamaForCausalLM``, ``LlamaForCausalLMEagle3``,
``MedusaModel``) or ``model_type`` medusa."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cinq.errors import InvalidParameterError


def _config(folder: str | Path) -> dict[str, Any] | None:
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
    cfg = _config(folder)
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


def _head_target(folder: str | Path) -> str | None:
    """The model name a cinq head was trained for, as the CLI accepts it (None: unknown or not a name)."""
    from cinq.assets import model_names
    from cinq.real_models import REAL_MODELS
    spec = (_config(folder) or {}).get("cinq_spec")
    target = spec.get("target") if isinstance(spec, dict) else None
    name = target.get("name") if isinstance(target, dict) else None
    if not isinstance(name, str):
        return None
    if name in model_names():
        return name
    # a head for a packaged real model records the model's file name
    return next((m.name for m in REAL_MODELS.values() if m.file == name), None)


def check_not_a_head(resolved: str | Path, given: str | None) -> None:
    """Refuse, naming ``model``, a speculative-decoding head given as the model, and say how to use it."""
    method = speculative_head_method(resolved)
    if method is None:
        return
    name = given or str(resolved)
    target = _head_target(resolved)
    spec = json.dumps({"method": method, "model": name, "num_speculative_tokens": 3})
    with_target = f"give its target model ({target}) and " if target else "give its target model and "
    raise InvalidParameterError(f"model: {name} is a speculative-decoding head, not a model: {with_target}pass "
                                f"the head in --speculative-config '{spec}'", "model")


def model_help() -> str:
    """The MODEL positional's help: the embedded and packaged model names (heads left out: they go in
    --speculative-config), and the paths that work."""
    from cinq.assets import ASSETS_DIR, embedded_model_names
    from cinq.real_models import REAL_MODELS
    embedded = embedded_model_names()
    models = [n for n in embedded if speculative_head_method(ASSETS_DIR / n) is None]
    heads = [n for n in embedded if n not in models]
    text = (f"the model: an embedded one ({', '.join(models)}), a packaged one ({', '.join(sorted(REAL_MODELS))}; "
            f"its pip package installed), a GGUF file, or a Hugging Face model folder (config.json + safetensors + "
            f"tokenizer.json); default: the embedded cinq-tiny")
    if heads:
        text += f". The embedded speculative heads ({', '.join(heads)}) go in --speculative-config"
    return text
