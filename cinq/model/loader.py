"""Build a model from a Hugging Face folder: config.json + safetensors (single file or sharded index).

Loading never unpickles. Each checkpoint tensor goes, unread until then, to the layer that owns it
(``layer.weight_loader(param, tensor, shard_id)``; plain parameters are copied whole): checkpoint names resolve
through the model's ``stacked_params_mapping`` (cinq/model/checkpoint_names.py), so q/k/v and gate/up fill the
shards of the merged projections. Every expected tensor must be present with the expected shape; errors name
the tensor. Quantized folders are recognised from ``quantization_config`` with no flag.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from cinq.errors import ModelLoadError
from cinq.layers.quantization.format import QuantFormat
from cinq.layers.quantization.linear import QuantizedLinear
from cinq.layers.weight_loader import CheckpointTensor, check_and_copy
from cinq.model.checkpoint_names import expected_checkpoint_names, mapping_of, resolve
from cinq.model.config import ModelConfig
from cinq.model.llama import LlamaForCausalLM

log = logging.getLogger(__name__)

# Tensors some checkpoints carry that have no parameter here (rotary tables are recomputed).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a model folder (sharded via model.safetensors.index.json, or single)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({path / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{index}: shard(s) {missing} listed in weight_map are missing")
        return files
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    others = sorted(path.glob("*.safetensors"))
    if others:
        return others
    if any(path.glob("*.bin")) or any(path.glob("*.pt")):
        raise ModelLoadError(f"{path}: only pickled weights (.bin/.pt) found; cinq loads safetensors only")
    raise ModelLoadError(f"{path}: no model.safetensors or model.safetensors.index.json")


def iter_checkpoint(path: Path) -> Iterator[CheckpointTensor]:
    """Every tensor of every shard, unread until its ``load()`` (valid until the next one is yielded)."""
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield CheckpointTensor.from_safetensors(f, name)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def quant_factory(config: ModelConfig) -> QuantFormat | None:
    """The linear factory for a quantized checkpoint, or None for a dense one."""
    if not config.quantization_config:
        return None
    return QuantFormat.from_hf(config.quantization_config)


def build_empty_model(config: ModelConfig, dtype: torch.dtype, device: torch.device | str,
                      attention_backend: str = "sdpa") -> LlamaForCausalLM:
    """The model with uninitialised storage on ``device`` (fill it with ``load_weights``)."""
    with default_dtype(dtype), torch.device("meta"):
        model = LlamaForCausalLM(config, quant_factory(config), attention_backend, dtype=dtype)
    model = model.to_empty(device=device)
    model.tie_weights()
    return model


def load_weights(model: LlamaForCausalLM, path: Path) -> None:
    """Fill the model from the folder's checkpoint tensors, then let layers repack (process_weights_after_loading)."""
    load_tensors(model, iter_checkpoint(path))
    for module in model.modules():
        hook = getattr(module, "process_weights_after_loading", None)
        if hook is not None:
            hook()


def load_tensors(model: nn.Module, tensors: Iterator[CheckpointTensor]) -> None:
    """Hand every checkpoint tensor to the layer that owns it, checking places, shapes and presence (errors
    name the checkpoint tensor)."""
    config = model.config
    tied = config.tie_word_embeddings
    modules = dict(model.named_modules())
    mapping = mapping_of(model)
    expected = expected_checkpoint_names(model, skip={"lm_head.weight"} if tied else None)
    loaded: set[str] = set()
    for tensor in tensors:
        name = tensor.name
        if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
            continue
        target = resolve(modules, mapping, name)
        module = modules[target.module] if target is not None else None
        if module is not None and target.param == "bias" and isinstance(module, QuantizedLinear) \
                and module.bias is None:
            continue  # some GPTQ writers store zero biases for layers that have none (vLLM skips them too)
        if target is None or name not in expected:
            raise ModelLoadError(f"checkpoint tensor '{name}' has no place in {config.architecture} "
                                 f"(unexpected tensor; is the quantization_config right?)")
        loader = getattr(module, "weight_loader", None)
        if loader is not None:
            loader(target.param, tensor, target.shard_id)
        else:  # norms, embeddings: the tensor is the whole parameter
            check_and_copy(getattr(module, target.param), tensor)
        loaded.add(name)
    missing = sorted(set(expected) - loaded)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ModelLoadError(f"checkpoint is missing tensor(s) {missing[:5]}{more}")


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """'bfloat16'/'bf16'/'float32'/'fp32'/'float16'/'fp16' -> torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    table = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
             "float": torch.float32, "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
    if name not in table:
        raise ModelLoadError(f"dtype: {name!r} is not one of {sorted(table)}", param="dtype")
    return table[name]


def load_model(path: str | Path, dtype: str | torch.dtype = "bfloat16", device: str | torch.device = "cpu",
               attention_backend: str = "sdpa") -> LlamaForCausalLM:
    """Load a Hugging Face model folder into a ready-to-run ``LlamaForCausalLM`` in eval mode."""
    path = Path(path)
    config = ModelConfig.from_pretrained(path)
    model = build_empty_model(config, parse_dtype(dtype), device, attention_backend)
    load_weights(model, path)
    return model.eval()
