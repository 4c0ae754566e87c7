"""Write a trained model as a self-contained Hugging Face folder: bf16 safetensors, config, generation config
(eos = ``<|end|>``) and the tokenizer files, loadable by cinq and by ``transformers``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from cinq.model.saver import save_model
from cinq.train.tokenizer_train import repair_bos_post_processor

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def export_model(model: Any, tokenizer_dir: str | Path, out: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Save ``model`` (in ``dtype``) and copy the tokenizer next to it; returns the folder. A source tokenizer
    whose tokenizer.json lacks the BOS post-processor its config's ``add_bos_token`` promises gets it in the
    copy, so transformers tokenizes the exported model's inputs as cinq does."""
    out = Path(out)
    save_model(model, out, dtype=dtype, tokenizer=tokenizer_dir)
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if src.is_file():
            shutil.copyfile(src, out / name)
    if (out / "tokenizer.json").is_file():
        repair_bos_post_processor(out)
    return out
