"""ModelRegistry: a checkpoint's ``architectures`` (config.json) -> the cinq class that serves it (vLLM's name).

A model family is one file in ``cinq/model/`` (``llama.py``, ``gemma3.py``) holding a class that follows
``cinq/model/interface.py``'s ``CausalLM``, and one ``ModelArchInfo`` per architecture name here. The registry is
torch-free and imports a family's module only when its class is asked for (``ModelConfig`` reads the per-family
facts below without importing any model), so a broken or heavy family costs nothing to the others.

Per-family facts (``ModelArchInfo``) replace what used to be booleans in ``model/config.py``: the model_type HF
writes, the qkv bias default, q/k norms, and the GGUF architecture llama.cpp names the family by.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from cinq.errors import ModelLoadError


@dataclass(slots=True, frozen=True)
class ModelArchInfo:
    """What cinq knows of one HF architecture name before building anything.

    ``module`` / ``class_name``: where the model class lives (imported lazily). ``model_type``: what config.json
    says in ``model_type`` (and what the saver writes). ``attention_bias`` is the qkv-bias default when the
    config does not say; ``qk_norm``: q/k RMS norms before rope. ``gguf_arch``: llama.cpp's
    ``general.architecture`` for the family (None: no GGUF support); ``extra_model_types``: other
    ``model_type`` spellings of the same architecture."""

    architecture: str
    model_type: str
    module: str
    class_name: str
    attention_bias: bool = False
    qk_norm: bool = False
    gguf_arch: str | None = None
    extra_model_types: tuple[str, ...] = ()


class _ModelRegistry:
    """Architecture name -> ``ModelArchInfo`` and its class (vLLM's ``ModelRegistry``)."""

    def __init__(self) -> None:
        self._infos: dict[str, ModelArchInfo] = {}

    def register_model(self, info: ModelArchInfo) -> None:
        """Add (or replace) an architecture. Out-of-tree families call this before loading a model."""
        self._infos[info.architecture] = info

    def get_supported_archs(self) -> list[str]:
        return sorted(self._infos)

    def is_supported(self, architecture: str) -> bool:
        return architecture in self._infos

    def info(self, architecture: str) -> ModelArchInfo:
        try:
            return self._infos[architecture]
        except KeyError:
            raise ModelLoadError(f"architecture {architecture!r} is not supported: cinq serves "
                                 f"{self.get_supported_archs()}", "architectures") from None

    def resolve(self, architectures: Any, model_type: Any) -> str | None:
        """The first supported name of ``architectures`` (a list), else the architecture of ``model_type``."""
        if isinstance(architectures, list):
            for arch in architectures:
                if isinstance(arch, str) and arch in self._infos:
                    return arch
        if isinstance(model_type, str):
            for info in self._infos.values():
                if model_type == info.model_type or model_type in info.extra_model_types:
                    return info.architecture
        return None

    def by_gguf_arch(self, gguf_arch: str) -> ModelArchInfo | None:
        """The architecture llama.cpp's ``general.architecture`` stands for (first registered wins)."""
        return next((i for i in self._infos.values() if i.gguf_arch == gguf_arch), None)

    def gguf_archs(self) -> list[str]:
        return sorted({i.gguf_arch for i in self._infos.values() if i.gguf_arch})

    def model_class(self, architecture: str) -> type:
        """The class serving ``architecture`` (its module imported now)."""
        info = self.info(architecture)
        return getattr(importlib.import_module(info.module), info.class_name)


ModelRegistry = _ModelRegistry()

_LLAMA = "cinq.model.llama"
for _info in (
    ModelArchInfo("LlamaForCausalLM", "llama", _LLAMA, "LlamaForCausalLM", gguf_arch="llama"),
    ModelArchInfo("MistralForCausalLM", "mistral", _LLAMA, "LlamaForCausalLM", gguf_arch="mistral"),
    ModelArchInfo("Qwen2ForCausalLM", "qwen2", _LLAMA, "LlamaForCausalLM", attention_bias=True, gguf_arch="qwen2"),
    ModelArchInfo("Qwen3ForCausalLM", "qwen3", _LLAMA, "LlamaForCausalLM", qk_norm=True, gguf_arch="qwen3"),
    ModelArchInfo("Gemma3ForCausalLM", "gemma3_text", "cinq.model.gemma3", "Gemma3ForCausalLM", qk_norm=True,
                  gguf_arch="gemma3", extra_model_types=("gemma3",)),
):
    ModelRegistry.register_model(_info)
