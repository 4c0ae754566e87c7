"""Write a quantized model folder: safetensors shards as the blocks are done, config.json with its
``quantization_config`` (+ AutoGPTQ's quantize_config.json), and the source's tokenizer files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from cinq.quant.config import QuantConfig

# Files copied unchanged from the source folder when present.
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
              "chat_template.jinja", "tokenizer.model")


class ShardWriter:
    """Accumulates tensors and flushes a shard whenever ``max_shard_bytes`` is reached, so writing never holds
    more than one shard in memory. One shard is named model.safetensors; more get an index like HF's."""

    def __init__(self, folder: Path, max_shard_bytes: int = 2 << 30) -> None:
        self.folder = folder
        self.max_bytes = max_shard_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.shards: list[tuple[Path, list[str]]] = []
        self.total_bytes = 0
        folder.mkdir(parents=True, exist_ok=True)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self.pending or any(name in names for _, names in self.shards):
            raise ValueError(f"tensor {name!r} written twice")
        t = tensor.detach().to("cpu").contiguous()
        self.pending[name] = t
        size = t.numel() * t.element_size()
        self.pending_bytes += size
        self.total_bytes += size
        if self.pending_bytes >= self.max_bytes:
            self._flush()

    def _flush(self) -> None:
        if not self.pending:
            return
        path = self.folder / f".shard-{len(self.shards):05d}.safetensors"
        save_file(self.pending, str(path), metadata={"format": "pt"})
        self.shards.append((path, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def finish(self) -> list[Path]:
        """Name the shards (model.safetensors, or model-0000i-of-0000n + index) and return their paths."""
        self._flush()
        stale = list(self.folder.glob("model*.safetensors")) + list(self.folder.glob("model.safetensors.index.json"))
        for old in stale:
            old.unlink()
        if len(self.shards) == 1:
            final = self.folder / "model.safetensors"
            self.shards[0][0].replace(final)
            return [final]
        n = len(self.shards)
        weight_map: dict[str, str] = {}
        paths = []
        for i, (path, names) in enumerate(self.shards):
            final = self.folder / f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            path.replace(final)
            paths.append(final)
            weight_map.update({name: final.name for name in names})
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        (self.folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        return paths


def write_configs(src: Path, dst: Path, raw_config: dict[str, Any], cfg: QuantConfig, dtype: torch.dtype) -> None:
    """config.json (source config + quantization_config), quantize_config.json for GPTQ, side files."""
    config = dict(raw_config)
    config["quantization_config"] = cfg.to_hf()
    if cfg.target.lm_head:
        config["tie_word_embeddings"] = False  # the head is its own (quantized) tensor now
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    qc = cfg.quantize_config_json()
    if qc is not None:
        (dst / "quantize_config.json").write_text(json.dumps(qc, indent=2) + "\n")
    elif (dst / "quantize_config.json").is_file():  # left by an earlier GPTQ run into the same folder
        (dst / "quantize_config.json").unlink()
    for name in SIDE_FILES:
        if (src / name).is_file() and src.resolve() != dst.resolve():
            shutil.copyfile(src / name, dst / name)
