"""The MODEL argument of the commands that run the engine: its help (the names the CLI accepts, read from the
same registry ``cinq.assets.resolve_model_path`` resolves them with) and the check that it is a model, not a
speculative-decoding head.

The embedded assets hold heads (cinq-tiny-eagle, smollm2-135m-instruct-eagle3, ...) next to models, and
``resolve_model_path`` accepts both (heads are resolved for speculative_config too). A head is recognised by its
config.json (cinq/model/head_marker.py); here the CLI says how to pass it, with the flag and its JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cinq.errors import InvalidParameterError
from cinq.model.head_marker import read_config as _config
from cinq.model.head_marker import speculative_head_method


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
