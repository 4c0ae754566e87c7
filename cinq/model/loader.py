"""Build a model from a Hugging Face folder: config.json + safetensors (single file or sharded index).

Loading never unpickles. Each checkpoint tensor goes, unread until then, to the layer that owns it
(``layer.weight_loader(param, tensor, shard_id)``; plain parameters are copied whole): checkpoint names resolve
through the model's ``stacked_params_mapping`` (cinq/model/checkpoint_names.py), so q/k/v and gate/up fill the
shards of the merged projections. Every expected tensor must be present with the expected shape; errors name
the tensor. Quantized folders are recognised from ``quantization_config`` with no flag.

A folder may be hostile: before any storage is allocated, every file is vetted (regular files under a size cap,
cinq/model/folder_files.py; safetensors headers against their file's size, cinq/model/checkpoint_files.py) and
the model's bytes, counted on its meta-device skeleton, are checked against the memory available
(cinq/model/memory.py). Every refusal is a ``ModelLoadError`` naming the file.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from cinq.distributed.parallel_state import TPShard, building_shard
from cinq.errors import ModelLoadError
from cinq.layers.quantization.format import DEFAULT_FORMAT, QuantFormat
from cinq.layers.linear import LinearFactory
from cinq.layers.quantization.linear import QuantizedLinear
from cinq.layers.weight_loader import CheckpointTensor, check_and_copy
from cinq.model.checkpoint_files import check_safetensors_file, checkpoint_files
from cinq.model.checkpoint_names import expected_checkpoint_names, mapping_of, resolve
from cinq.model.config import ModelConfig
from cinq.model.interface import CausalLM
from cinq.model.registry import ModelRegistry
from cinq.model.gguf.file import GGUF_QUANT_METHOD, find_gguf_file
from cinq.model.head_marker import speculative_head_method
from cinq.model.memory import check_fits

# checkpoint_files is re-exported: the offline tools find a folder's shards through this module.
__all__ = ["checkpoint_files", "iter_checkpoint", "load_model", "load_tensors", "load_weights", "build_empty_model",
           "parse_dtype", "quant_factory", "quantization_summary"]

log = logging.getLogger(__name__)

# Tensors some checkpoints carry that have no parameter here (rotary tables are recomputed).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def iter_checkpoint(path: Path) -> Iterator[CheckpointTensor]:
    """Every tensor of every shard, unread until its ``load()`` (valid until the next one is yielded). Each
    file's header is vetted first (cinq/model/checkpoint_files.py): safetensors never sees a hostile one."""
    files = checkpoint_files(path)
    for file in files:
        check_safetensors_file(file)
    for file in files:
        try:
            handle = safe_open(str(file), framework="pt", device="cpu")
        except (SafetensorError, OSError) as e:  # what the header check cannot see (overlapping tensors ...)
            raise ModelLoadError(f"{file}: not a readable safetensors file: {e}") from None
        with handle as f:
            for name in f.keys():
                yield CheckpointTensor.from_safetensors(f, name, str(file))


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def quant_factory(config: ModelConfig, source: str | Path = "config.json") -> QuantFormat | None:
    """The linear factory for a quantized checkpoint, or None for a dense one (errors name ``source``). A GGUF
    file's factory needs the file: ``cinq.model.gguf.plan.GGUFFormat.of``."""
    if not config.quantization_config:
        return None
    if config.quantization_config.get("quant_method") == GGUF_QUANT_METHOD:
        raise ModelLoadError(f"{source}: a GGUF model's linears are built from its file (GGUFFormat.of)")
    try:
        return QuantFormat.from_hf(config.quantization_config)
    except ModelLoadError as e:
        raise ModelLoadError(f"{source}: {e}", e.param) from None
    except (TypeError, ValueError) as e:  # int("four"), int(None): a field of the wrong type
        raise ModelLoadError(f"{source}: quantization_config: {e}", "quantization_config") from None


_METHOD_NAMES = {"rtn": "RTN", "gptq": "GPTQ", "awq": "AWQ", "smoothquant": "SmoothQuant"}


def quantization_summary(config: ModelConfig) -> str | None:
    """How a quantized checkpoint stores its weights, for the load line: "GPTQ int4, group 128" (the method that
    chose the integers; the storage format too when it is not that method's own); None for a dense one."""
    if (config.quantization_config or {}).get("quant_method") == GGUF_QUANT_METHOD:
        return config.quantization_config.get("summary", "GGUF")
    quant = quant_factory(config)
    if quant is None:
        return None
    if quant.format == "bnb_nf4":
        return "bitsandbytes NF4" + (" (double-quantized absmax)" if quant.double_quant else "")
    if quant.method == "fp8":
        acts = "weight-only" if quant.act_scheme == "none" else f"{quant.act_scheme} FP8 activations"
        return f"FP8 e4m3 ({quant.format}, per-{quant.weight_strategy} weight scales, {acts})"
    if quant.format == "w8a8":
        return f"{_METHOD_NAMES[quant.method]} W8A8 (int8 weights, {quant.act_scheme} int8 activations)"
    parts = [f"{_METHOD_NAMES[quant.method]} int{quant.bits}",
             f"group {quant.group_size}" if quant.group_size > 0 else "per channel"]
    if not quant.sym and quant.format != "awq":  # AWQ's grid has zero points as a rule
        parts.append("asymmetric")
    if quant.desc_act:
        parts.append("act-order")
    if quant.format != DEFAULT_FORMAT[quant.method]:
        parts.append(f"{quant.format} format")
    if quant.lm_head:
        parts.append("quantized LM head")
    return ", ".join(parts)


def build_empty_model(config: ModelConfig, dtype: torch.dtype, device: torch.device | str,
                      attention_backend: str = "sdpa", path: Path | None = None,
                      shard: TPShard | None = None, quant: LinearFactory | None = None) -> CausalLM:
    """The model with uninitialised storage on ``device`` (fill it with ``load_weights``). With ``path`` (the
    folder or file it comes from), refuses first a model that cannot fit in the device's available memory.
    ``shard``: build only that tensor-parallel rank's part (None: the whole model). ``quant``: the linear factory
    (default: the one ``config.quantization_config`` describes)."""
    # the family's module is imported (on a first load) outside the meta-device context: a module-level tensor it
    # makes must be a real CPU tensor (a meta one passed to a kernel dispatches to its Meta kernel, which computes
    # nothing: the fused decode step's empty tree mask did, and its attention returned uninitialised memory)
    model_class = ModelRegistry.model_class(config.architecture)
    with default_dtype(dtype), torch.device("meta"), building_shard(shard):
        if quant is None:
            quant = quant_factory(config, path / "config.json" if path is not None and path.is_dir()
                                  else path or "config.json")
        model = model_class(config, quant, attention_backend, dtype=dtype)
    if path is not None:
        model.tie_weights()  # count a tied embedding once
        check_fits(model, dtype, device, path)
    model = model.to_empty(device=device)
    model.tie_weights()
    return model


def load_weights(model: CausalLM, path: Path) -> None:
    """Fill the model from the folder's checkpoint tensors, then let layers repack (process_weights_after_loading)."""
    load_tensors(model, iter_checkpoint(path))
    finish_loading(model)


def finish_loading(model: nn.Module) -> None:
    """Let every layer repack what it loaded (``process_weights_after_loading``)."""
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


def load_gguf_model(path: Path, dtype: torch.dtype, device: str | torch.device, attention_backend: str,
                    shard: TPShard | None = None) -> CausalLM:
    """The model of a GGUF file (cinq/model/gguf/): the same model class, its linears built by the file's
    ``GGUFFormat`` (its own Q8_0 / Q4_0 / Q4_1 blocks) and its tensors streamed from the mapped file."""
    from cinq.model.gguf.file import read_gguf
    from cinq.model.gguf.plan import GGUFFormat, gguf_model_dict
    from cinq.model.gguf.weights import iter_gguf_checkpoint
    gguf = read_gguf(path)
    config = ModelConfig.from_dict(gguf_model_dict(gguf), source=str(path))
    fmt = GGUFFormat.of(gguf, config.num_hidden_layers, tied="output.weight" not in gguf.tensors)
    model = build_empty_model(config, dtype, device, attention_backend, path, shard, quant=fmt)
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    load_tensors(model, iter_gguf_checkpoint(gguf, fmt, heads))
    finish_loading(model)
    return model.eval()


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
               attention_backend: str = "sdpa", shard: TPShard | None = None) -> CausalLM:
    """Load a Hugging Face model folder (or a GGUF file, or a folder holding one) into a ready-to-run model (the
    registry's class for its architecture) in eval mode; with ``shard``, only that tensor-parallel rank's part
    (each tensor's slice is read alone from the file)."""
    path = Path(path)
    dtype = parse_dtype(dtype)
    gguf = find_gguf_file(path)
    if gguf is not None:
        return load_gguf_model(gguf, dtype, device, attention_backend, shard)
    method = speculative_head_method(path)
    if method is not None:
        raise ModelLoadError(f"{path}: a speculative-decoding head ({method}), not a model: give it as "
                             f"speculative_config's model, beside the target model it was trained for", "model")
    config = ModelConfig.from_pretrained(path)
    for file in checkpoint_files(path):  # a hostile file is refused before memory is allocated for the model
        check_safetensors_file(file)
    model = build_empty_model(config, dtype, device, attention_backend, path, shard)
    load_weights(model, path)
    return model.eval()
