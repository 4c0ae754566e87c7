"""A GGUF file as a dense Hugging Face folder (``cinq export model.gguf --format hf --out DIR``): config.json,
generation_config.json, tokenizer.json / tokenizer_config.json from the file's vocabulary, and every tensor
dequantized (the gguf package's reference values) into model.safetensors in ``dtype``, q/k rows in Hugging Face's
rotate-half order.

What it is for: every offline tool that starts from dense weights (``cinq quantize``, the quantization study,
distillation, transformers) can then start from a GGUF model. The folder's "dense" weights are the file's own
quantized values: requantizing them onto another 4-bit grid compounds two roundings.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from cinq.errors import InvalidParameterError
from cinq.model.generation_defaults import SAMPLING_KEYS
from cinq.model.gguf.config import gguf_config_dict
from cinq.model.gguf.file import find_gguf_file, read_gguf
from cinq.model.gguf.tokenizer import end_of_turn_ids, gguf_tokenizer
from cinq.model.gguf.weights import iter_gguf_checkpoint
from cinq.model.loader import parse_dtype


def gguf_to_folder(model: str | Path, out: str | Path, dtype: str = "bfloat16") -> Path:
    """Write the GGUF file ``model`` (or the folder holding one) as a dense folder ``out``; returns ``out``."""
    from cinq.real_models import real_model_for_file
    file = find_gguf_file(Path(model))
    if file is None:
        raise InvalidParameterError(f"model: {model} is not a GGUF file (--format hf converts GGUF files)", "model")
    torch_dtype = parse_dtype(dtype)
    gguf = read_gguf(file)
    cfg = gguf_config_dict(gguf)
    eos = list(dict.fromkeys(([cfg["eos_token_id"]] if "eos_token_id" in cfg else []) + end_of_turn_ids(gguf)))
    cfg["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    cfg["torch_dtype"] = str(torch_dtype).removeprefix("torch.")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
    tensors = {t.name: t.load().to(torch_dtype).contiguous() for t in iter_gguf_checkpoint(gguf, None, heads)}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen = {"bos_token_id": cfg.get("bos_token_id"), "eos_token_id": eos}
    named = real_model_for_file(file)
    if named is not None:  # the defaults cinq applies to the file carry over to its folder
        gen.update({k: v for k, v in named.generation_config.items() if k in SAMPLING_KEYS})
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    tok, tok_config = gguf_tokenizer(gguf, cfg["vocab_size"])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
    return out
