"""Write a trained model as a self-contained Hugging Face folder: bf16 safetensors, config, generation config
(eos = ``<|end|>``) and the tokenizer files, loadable by cinq and by ``transformers``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from cinq.model.saver import save_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def export_model(model: Any, tokenizer_dir: str | Path, out: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Save ``model`` (in ``dtype``) and copy the tokenizer next to it; returns the folder."""
    out = Path(out)
    save_model(model, out, dtype=dtype)
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if src.is_file():
            shutil.copyfile(src, out / name)
    return out
