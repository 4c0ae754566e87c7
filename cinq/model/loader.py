"""Build a model from a Hugging Face folder: config.json + safetensors (single file or sharded index).

Loading never unpickles. Every expected tensor must be present with the expected shape; errors name the tensor.
Quantized folders are recognised from ``quantization_config`` with no flag.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from cinq.errors import ModelLoadError
from cinq.layers.linear import QuantizedLinear
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


def iter_checkpoint(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every tensor of every shard."""
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def quant_factory(config: ModelConfig):
    """The linear factory for a quantized checkpoint, or None for a dense one."""
    if not config.quantization_config:
        return None
    from cinq.quant.config import QuantConfig  # quantization is optional at import time
    return QuantConfig.from_hf(config.quantization_config)


def build_empty_model(config: ModelConfig, dtype: torch.dtype, device: torch.device | str,
                      attention_backend: str = "sdpa") -> LlamaForCausalLM:
    """The model with uninitialised storage on ``device`` (fill it with ``load_weights``)."""
    with default_dtype(dtype), torch.device("meta"):
        model = LlamaForCausalLM(config, quant_factory(config), attention_backend)
    model = model.to_empty(device=device)
    model.tie_weights()
    return model


def load_weights(model: LlamaForCausalLM, path: Path) -> None:
    """Copy every checkpoint tensor into the parameter/buffer of the same name, checking shapes and presence."""
    expected: dict[str, torch.Tensor] = dict(model.named_parameters())
    expected.update(dict(model.named_buffers()))
    tied = model.config.tie_word_embeddings
    loaded: set[str] = set()
    for name, tensor in iter_checkpoint(path):
        if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
            continue
        target = expected.get(name)
        if target is None and name.endswith(".bias") and _is_quantized(model, name.removesuffix(".bias")):
            continue  # some GPTQ writers store zero biases for layers that have none (vLLM skips them too)
        if target is None:
            raise ModelLoadError(f"checkpoint tensor '{name}' has no place in {model.config.architecture} "
                                 f"(unexpected tensor; is the quantization_config right?)")
        if tuple(tensor.shape) != tuple(target.shape):
            hint = ""
            if _is_quantized(model, name.rpartition(".")[0]):
                hint = " (check quantization_config's bits and group_size against the tensors)"
            raise ModelLoadError(f"checkpoint tensor '{name}': shape {tuple(tensor.shape)} does not match the "
                                 f"model's {tuple(target.shape)}{hint}")
        if tensor.is_floating_point() != target.is_floating_point():
            raise ModelLoadError(f"checkpoint tensor '{name}': dtype {tensor.dtype} cannot load into {target.dtype}")
        with torch.no_grad():
            target.copy_(tensor)
        loaded.add(name)
    missing = sorted(set(expected) - loaded)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ModelLoadError(f"checkpoint is missing tensor(s) {missing[:5]}{more}")
    for module in model.modules():
        hook = getattr(module, "process_weights_after_loading", None)
        if hook is not None:
            hook()


def _is_quantized(model: LlamaForCausalLM, module_name: str) -> bool:
    try:
        module = model.get_submodule(module_name)
    except AttributeError:
        return False
    return isinstance(module, QuantizedLinear)


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
